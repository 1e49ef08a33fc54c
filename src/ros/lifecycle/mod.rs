//! The managed-node (lifecycle) protocol as rclcpp serves it, on the node's private names:
//! `~/change_state`, `~/get_state`, `~/get_available_states`, `~/get_available_transitions`,
//! `~/get_transition_graph` and the `~/transition_event` topic (lifecycle_msgs). r2r has no
//! lifecycle API, so the node serves it here; the state machine is [`machine`], the node's
//! work for each step a [`Driver`] (docs/lifecycle.md says what each state means).

pub mod machine;

use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use r2r::lifecycle_msgs::msg::{State, Transition, TransitionDescription, TransitionEvent};
use r2r::lifecycle_msgs::srv::{
    ChangeState, GetAvailableStates, GetAvailableTransitions, GetState,
};
use r2r::{Publisher, QosProfile, ServiceRequest};

use crate::ros::qos::requests_qos;
use crate::ros::spin::Drains;
pub use machine::{Edge, Machine, Outcome, StateId, Step};

/// The node's work for each step of a transition.
pub trait Driver: Send + Sync + 'static {
    /// Does the work of `step`; how it ended decides the state reached.
    fn run(&self, step: Step) -> impl Future<Output = Outcome> + Send;
    /// The node reached `finalized` and every event of it went out: the process may end.
    fn finalized(&self);
}

/// The lifecycle state, shared by the protocol, the ask path and diagnostics.
#[derive(Clone, Default)]
pub struct Lifecycle {
    machine: Arc<Mutex<Machine>>,
}

impl Lifecycle {
    /// Already active: an ask context outside a managed node (planning on its own, tests).
    pub fn active() -> Self {
        Self {
            machine: Arc::new(Mutex::new(Machine::at(StateId::ACTIVE))),
        }
    }

    /// Puts the machine in `state` (unit tests of what reads it).
    #[cfg(test)]
    pub(crate) fn force(&self, state: StateId) {
        self.with(|m| *m = Machine::at(state));
    }

    pub fn state(&self) -> StateId {
        self.with(|m| m.state())
    }

    /// A panic while the lock was held left a consistent state (each change is one
    /// assignment), so a poisoned lock is used as it is.
    fn with<R>(&self, f: impl FnOnce(&mut Machine) -> R) -> R {
        f(&mut self.machine.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The protocol's services and publisher, created before the spin thread starts.
pub struct Entities {
    change: futures::channel::mpsc::UnboundedReceiver<ServiceRequest<ChangeState::Service>>,
    get_state: futures::channel::mpsc::UnboundedReceiver<ServiceRequest<GetState::Service>>,
    states: futures::channel::mpsc::UnboundedReceiver<ServiceRequest<GetAvailableStates::Service>>,
    transitions:
        futures::channel::mpsc::UnboundedReceiver<ServiceRequest<GetAvailableTransitions::Service>>,
    graph:
        futures::channel::mpsc::UnboundedReceiver<ServiceRequest<GetAvailableTransitions::Service>>,
    events: Publisher<TransitionEvent>,
}

impl Entities {
    pub fn create(node: &mut r2r::Node, drains: &mut Drains) -> r2r::Result<Self> {
        let qos = requests_qos;
        Ok(Self {
            change: drains.relay(node.create_service("~/change_state", qos())?),
            get_state: drains.relay(node.create_service("~/get_state", qos())?),
            states: drains.relay(node.create_service("~/get_available_states", qos())?),
            transitions: drains.relay(node.create_service("~/get_available_transitions", qos())?),
            graph: drains.relay(node.create_service("~/get_transition_graph", qos())?),
            events: node.create_publisher("~/transition_event", QosProfile::default())?,
        })
    }
}

/// Runs transitions: the machine, the node's work and the events, one transition at a time.
pub struct Protocol<D> {
    pub lifecycle: Lifecycle,
    driver: Arc<D>,
    /// Behind a lock: a publisher is `Send`, not `Sync`.
    events: Mutex<Publisher<TransitionEvent>>,
    /// One transition at a time, whoever asks (a client, the autostart).
    running: tokio::sync::Mutex<()>,
}

fn state_msg(s: StateId) -> State {
    State {
        id: s.0,
        label: s.label().to_owned(),
    }
}

fn description(e: &Edge) -> TransitionDescription {
    TransitionDescription {
        transition: Transition {
            id: e.id,
            label: e.label.to_owned(),
        },
        start_state: state_msg(e.start),
        goal_state: state_msg(e.goal),
    }
}

impl<D: Driver> Protocol<D> {
    pub fn new(lifecycle: Lifecycle, driver: Arc<D>, entities: &Entities) -> Arc<Self> {
        Arc::new(Self {
            lifecycle,
            driver,
            events: Mutex::new(entities.events.clone()),
            running: tokio::sync::Mutex::new(()),
        })
    }

    /// The node's work for each step.
    pub fn driver(&self) -> &D {
        &self.driver
    }

    fn publish(&self, e: &Edge) {
        let timestamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let d = description(e);
        let msg = TransitionEvent {
            timestamp,
            transition: d.transition,
            start_state: d.start_state,
            goal_state: d.goal_state,
        };
        let sent = self
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .publish(&msg);
        if let Err(err) = sent {
            tracing::warn!(error = %err, "could not publish the transition event");
        }
    }

    /// Runs the transition `id` (or, with id 0, the one `label` names) to its end: `true`
    /// when its work succeeded. A refused one changes nothing.
    pub async fn change(&self, id: u8, label: &str) -> bool {
        let _one = self.running.lock().await;
        let (edge, step) = match self.lifecycle.with(|m| m.begin(id, label)) {
            Ok(begun) => begun,
            Err(e) => {
                tracing::warn!("lifecycle: {e}");
                return false;
            }
        };
        tracing::info!(
            "lifecycle: {} ({} -> {})",
            edge.label,
            edge.start.label(),
            edge.goal.label()
        );
        self.publish(&edge);
        let mut outcome = self.driver.run(step).await;
        let succeeded = outcome == Outcome::Success;
        loop {
            let (edge, next) = self.lifecycle.with(|m| m.finish(outcome));
            self.publish(&edge);
            tracing::info!("lifecycle: now {}", edge.goal.label());
            match next {
                Some(step) => outcome = self.driver.run(step).await,
                None => break,
            }
        }
        succeeded
    }

    /// Serves the protocol's services until their streams end; returns the tasks.
    pub fn serve(self: &Arc<Self>, e: Entities) -> Vec<tokio::task::JoinHandle<()>> {
        let me = self.clone();
        let change = tokio::spawn(async move {
            let mut requests = e.change;
            while let Some(req) = requests.next().await {
                let t = &req.message.transition;
                let success = me.change(t.id, &t.label).await;
                if let Err(err) = req.respond(ChangeState::Response { success }) {
                    tracing::warn!(error = %err, "could not send the change_state response");
                }
                if me.lifecycle.state() == StateId::FINALIZED {
                    me.driver.finalized();
                }
            }
        });
        let lc = self.lifecycle.clone();
        let get_state = answer(e.get_state, move |_| GetState::Response {
            current_state: state_msg(lc.state()),
        });
        let states = answer(e.states, |_| GetAvailableStates::Response {
            available_states: StateId::ALL.iter().map(|s| state_msg(*s)).collect(),
        });
        let lc = self.lifecycle.clone();
        let transitions = answer(e.transitions, move |_| GetAvailableTransitions::Response {
            available_transitions: lc.with(|m| m.available()).iter().map(description).collect(),
        });
        let graph = answer(e.graph, |_| GetAvailableTransitions::Response {
            available_transitions: Machine::graph().iter().map(description).collect(),
        });
        vec![change, get_state, states, transitions, graph]
    }
}

/// Answers each request of `requests` at once with `f`.
fn answer<S: r2r::WrappedServiceTypeSupport + 'static>(
    mut requests: impl Stream<Item = ServiceRequest<S>> + Unpin + Send + 'static,
    f: impl Fn(&S::Request) -> S::Response + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    S::Request: Send,
    S::Response: Send,
{
    tokio::spawn(async move {
        while let Some(req) = requests.next().await {
            let resp = f(&req.message);
            if let Err(err) = req.respond(resp) {
                tracing::warn!(error = %err, "could not send a lifecycle response");
            }
        }
    })
}
