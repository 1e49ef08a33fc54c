//! The managed-node state machine of the ROS 2 design (lifecycle_msgs' State and Transition
//! ids, rcl_lifecycle's labels), pure: which transitions may start from which state, the
//! transition state each passes through, and where each outcome of the node's work leads,
//! the error-processing path included. The ROS glue (`super`) serves it; the node's work
//! for each [`Step`] lives with the node (`crate::managed`).

/// A state id as `lifecycle_msgs/msg/State` numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateId(pub u8);

impl StateId {
    pub const UNKNOWN: Self = Self(0);
    pub const UNCONFIGURED: Self = Self(1);
    pub const INACTIVE: Self = Self(2);
    pub const ACTIVE: Self = Self(3);
    pub const FINALIZED: Self = Self(4);
    pub const CONFIGURING: Self = Self(10);
    pub const CLEANING_UP: Self = Self(11);
    pub const SHUTTING_DOWN: Self = Self(12);
    pub const ACTIVATING: Self = Self(13);
    pub const DEACTIVATING: Self = Self(14);
    pub const ERROR_PROCESSING: Self = Self(15);

    /// Every state, primary ones first (what `get_available_states` lists).
    pub const ALL: [Self; 10] = [
        Self::UNCONFIGURED,
        Self::INACTIVE,
        Self::ACTIVE,
        Self::FINALIZED,
        Self::CONFIGURING,
        Self::CLEANING_UP,
        Self::SHUTTING_DOWN,
        Self::ACTIVATING,
        Self::DEACTIVATING,
        Self::ERROR_PROCESSING,
    ];

    /// rcl_lifecycle's label.
    pub fn label(self) -> &'static str {
        match self.0 {
            1 => "unconfigured",
            2 => "inactive",
            3 => "active",
            4 => "finalized",
            10 => "configuring",
            11 => "cleaningup",
            12 => "shuttingdown",
            13 => "activating",
            14 => "deactivating",
            15 => "errorprocessing",
            _ => "unknown",
        }
    }
}

/// One edge of the graph: a transition id (`lifecycle_msgs/msg/Transition`), its label, the
/// state it leaves and the state it reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    pub id: u8,
    pub label: &'static str,
    pub start: StateId,
    pub goal: StateId,
}

const fn edge(id: u8, label: &'static str, start: StateId, goal: StateId) -> Edge {
    Edge {
        id,
        label,
        start,
        goal,
    }
}

use StateId as S;

/// The transitions a client may ask for (`change_state`), each from one primary state into
/// its transition state.
pub const TRIGGERS: [Edge; 7] = [
    edge(1, "configure", S::UNCONFIGURED, S::CONFIGURING),
    edge(2, "cleanup", S::INACTIVE, S::CLEANING_UP),
    edge(3, "activate", S::INACTIVE, S::ACTIVATING),
    edge(4, "deactivate", S::ACTIVE, S::DEACTIVATING),
    edge(5, "shutdown", S::UNCONFIGURED, S::SHUTTING_DOWN),
    edge(6, "shutdown", S::INACTIVE, S::SHUTTING_DOWN),
    edge(7, "shutdown", S::ACTIVE, S::SHUTTING_DOWN),
];

const OK: &str = "transition_success";
const FAIL: &str = "transition_failure";
const ERR: &str = "transition_error";

/// Where a transition state goes on success, failure and error of the node's work.
pub const RESULTS: [Edge; 18] = [
    edge(10, OK, S::CONFIGURING, S::INACTIVE),
    edge(11, FAIL, S::CONFIGURING, S::UNCONFIGURED),
    edge(12, ERR, S::CONFIGURING, S::ERROR_PROCESSING),
    edge(20, OK, S::CLEANING_UP, S::UNCONFIGURED),
    edge(21, FAIL, S::CLEANING_UP, S::INACTIVE),
    edge(22, ERR, S::CLEANING_UP, S::ERROR_PROCESSING),
    edge(30, OK, S::ACTIVATING, S::ACTIVE),
    edge(31, FAIL, S::ACTIVATING, S::INACTIVE),
    edge(32, ERR, S::ACTIVATING, S::ERROR_PROCESSING),
    edge(40, OK, S::DEACTIVATING, S::INACTIVE),
    edge(41, FAIL, S::DEACTIVATING, S::ACTIVE),
    edge(42, ERR, S::DEACTIVATING, S::ERROR_PROCESSING),
    edge(50, OK, S::SHUTTING_DOWN, S::FINALIZED),
    edge(51, FAIL, S::SHUTTING_DOWN, S::FINALIZED),
    edge(52, ERR, S::SHUTTING_DOWN, S::ERROR_PROCESSING),
    edge(60, OK, S::ERROR_PROCESSING, S::UNCONFIGURED),
    edge(61, FAIL, S::ERROR_PROCESSING, S::FINALIZED),
    edge(62, ERR, S::ERROR_PROCESSING, S::FINALIZED),
];

/// The work a transition state asks of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Open the model.
    Configure,
    /// Release every BPU buffer, task and model.
    Cleanup,
    /// Start serving.
    Activate,
    /// Stop serving (the running request finishes or is cancelled, queued ones cancelled).
    Deactivate,
    /// Release everything; the process exits after.
    Shutdown,
    /// After an error: release everything, as cleanup does.
    ErrorProcessing,
}

impl Step {
    fn of(state: StateId) -> Option<Self> {
        Some(match state {
            S::CONFIGURING => Self::Configure,
            S::CLEANING_UP => Self::Cleanup,
            S::ACTIVATING => Self::Activate,
            S::DEACTIVATING => Self::Deactivate,
            S::SHUTTING_DOWN => Self::Shutdown,
            S::ERROR_PROCESSING => Self::ErrorProcessing,
            _ => return None,
        })
    }
}

/// How the node's work for a [`Step`] ended (rclcpp's callback return codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// The step could not be done; the node is back where it was (or unconfigured).
    Failure,
    /// Something went wrong beyond the step: error processing follows.
    Error,
}

/// A `change_state` request the machine cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("transition {id} ({label:?}) is not a transition a client can ask for")]
    Unknown { id: u8, label: String },
    #[error("transition {label:?} cannot start from state {state:?}")]
    NotFrom {
        label: &'static str,
        state: &'static str,
    },
}

/// The node's lifecycle state.
#[derive(Debug, Clone)]
pub struct Machine {
    state: StateId,
}

impl Default for Machine {
    fn default() -> Self {
        Self {
            state: S::UNCONFIGURED,
        }
    }
}

impl Machine {
    /// A machine in `state` (a node that is not driven from unconfigured).
    pub fn at(state: StateId) -> Self {
        Self { state }
    }

    pub fn state(&self) -> StateId {
        self.state
    }

    /// The transitions a client may ask for now (`get_available_transitions`).
    pub fn available(&self) -> Vec<Edge> {
        TRIGGERS
            .iter()
            .filter(|e| e.start == self.state)
            .copied()
            .collect()
    }

    /// Every edge of the graph (`get_transition_graph`).
    pub fn graph() -> Vec<Edge> {
        TRIGGERS.iter().chain(RESULTS.iter()).copied().collect()
    }

    /// Starts the transition a client asked for, by id or, with id 0, by label (as rclcpp
    /// does): the edge taken into the transition state and the work it asks for. Refused,
    /// nothing changes.
    pub fn begin(&mut self, id: u8, label: &str) -> Result<(Edge, Step), Refused> {
        let wanted = |e: &&Edge| {
            if id != 0 {
                e.id == id
            } else {
                !label.is_empty() && e.label == label
            }
        };
        let mut named = TRIGGERS.iter().filter(wanted).peekable();
        let Some(first) = named.peek().copied().copied() else {
            return Err(Refused::Unknown {
                id,
                label: label.to_owned(),
            });
        };
        let Some(edge) = named.find(|e| e.start == self.state).copied() else {
            return Err(Refused::NotFrom {
                label: first.label,
                state: self.state.label(),
            });
        };
        self.state = edge.goal;
        let step = Step::of(edge.goal).unwrap_or(Step::ErrorProcessing);
        Ok((edge, step))
    }

    /// Ends the current transition state with `outcome`: the edge taken, and the work of
    /// error processing when that is where it led (call `finish` again with its outcome).
    pub fn finish(&mut self, outcome: Outcome) -> (Edge, Option<Step>) {
        let index = match outcome {
            Outcome::Success => 0,
            Outcome::Failure => 1,
            Outcome::Error => 2,
        };
        let edge = RESULTS
            .iter()
            .filter(|e| e.start == self.state)
            .nth(index)
            .copied()
            // Not in a transition state: nothing to finish, the state stays.
            .unwrap_or(edge(0, "", self.state, self.state));
        self.state = edge.goal;
        let next = (edge.goal == S::ERROR_PROCESSING).then_some(Step::ErrorProcessing);
        (edge, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(m: &mut Machine, id: u8, outcome: Outcome) -> Vec<Edge> {
        let (e, _) = m.begin(id, "").unwrap();
        let mut edges = vec![e];
        let mut o = outcome;
        loop {
            let (e, next) = m.finish(o);
            edges.push(e);
            if next.is_none() {
                return edges;
            }
            o = Outcome::Success;
        }
    }

    #[test]
    fn the_happy_path_passes_through_each_transition_state() {
        let mut m = Machine::default();
        assert_eq!(m.state(), S::UNCONFIGURED);
        let ids = |v: Vec<Edge>| v.iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(ids(run(&mut m, 1, Outcome::Success)), [1, 10]);
        assert_eq!(m.state(), S::INACTIVE);
        assert_eq!(ids(run(&mut m, 3, Outcome::Success)), [3, 30]);
        assert_eq!(m.state(), S::ACTIVE);
        assert_eq!(ids(run(&mut m, 4, Outcome::Success)), [4, 40]);
        assert_eq!(ids(run(&mut m, 2, Outcome::Success)), [2, 20]);
        assert_eq!(m.state(), S::UNCONFIGURED);
        assert_eq!(ids(run(&mut m, 5, Outcome::Success)), [5, 50]);
        assert_eq!(m.state(), S::FINALIZED);
        assert!(m.available().is_empty());
    }

    #[test]
    fn invalid_transitions_are_refused_and_change_nothing() {
        let mut m = Machine::default();
        let e = m.begin(3, "").unwrap_err();
        assert!(matches!(
            e,
            Refused::NotFrom {
                label: "activate",
                state: "unconfigured"
            }
        ));
        assert_eq!(m.state(), S::UNCONFIGURED);
        assert!(matches!(m.begin(10, ""), Err(Refused::Unknown { .. })));
        assert!(matches!(m.begin(0, ""), Err(Refused::Unknown { .. })));
        assert!(matches!(m.begin(99, ""), Err(Refused::Unknown { .. })));
        assert!(m.begin(6, "").is_err());
        assert_eq!(m.state(), S::UNCONFIGURED);
    }

    #[test]
    fn labels_pick_the_transition_from_the_current_state() {
        let mut m = Machine::default();
        assert_eq!(m.begin(0, "configure").unwrap().0.id, 1);
        m.finish(Outcome::Success);
        let (e, step) = m.begin(0, "shutdown").unwrap();
        assert_eq!((e.id, step), (6, Step::Shutdown));
    }

    #[test]
    fn failures_go_back_and_errors_go_through_error_processing() {
        let mut m = Machine::default();
        let (_, step) = m.begin(1, "").unwrap();
        assert_eq!(step, Step::Configure);
        assert_eq!(m.finish(Outcome::Failure), (RESULTS[1], None));
        assert_eq!(m.state(), S::UNCONFIGURED);
        m.begin(1, "").unwrap();
        let (e, next) = m.finish(Outcome::Error);
        assert_eq!((e.id, next), (12, Some(Step::ErrorProcessing)));
        assert_eq!(m.state(), S::ERROR_PROCESSING);
        assert_eq!(m.finish(Outcome::Success).0.id, 60);
        assert_eq!(m.state(), S::UNCONFIGURED);
        m.begin(1, "").unwrap();
        m.finish(Outcome::Error);
        assert_eq!(m.finish(Outcome::Failure).0.id, 61);
        assert_eq!(m.state(), S::FINALIZED);
    }

    #[test]
    fn available_transitions_follow_the_state() {
        let mut m = Machine::default();
        let ids = |m: &Machine| m.available().iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(ids(&m), [1, 5]);
        run(&mut m, 1, Outcome::Success);
        assert_eq!(ids(&m), [2, 3, 6]);
        run(&mut m, 3, Outcome::Success);
        assert_eq!(ids(&m), [4, 7]);
        assert_eq!(Machine::graph().len(), 25);
        assert!(StateId::ALL.iter().all(|s| s.label() != "unknown"));
    }
}
