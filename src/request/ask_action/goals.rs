//! The goal table of the Ask action server: each goal's state in the action protocol
//! (`action_msgs/GoalStatus`), its result once it has one, the `get_result` requests waiting
//! for it, and the expiry of finished goals after the result timeout, as rcl_action does
//! (r2r 0.9.7's server never expires a goal, so every goal would stay in memory and in every
//! status message for the node's lifetime). No ROS I/O here: the server task owns the table
//! and sends what it returns.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use r2r::action_msgs::msg::{GoalInfo, GoalStatus, GoalStatusArray};
use r2r::action_msgs::srv::CancelGoal;
use r2r::builtin_interfaces::msg::Time;

use crate::interface::ErrorCode;
use crate::msgs::action::Ask;

/// A goal's id: `unique_identifier_msgs/UUID`'s 16 bytes.
pub(crate) type GoalId = [u8; 16];

// The protocol's values (action_msgs), as the i8 its messages carry.
pub(crate) const STATUS_UNKNOWN: i8 = GoalStatus::STATUS_UNKNOWN as i8;
pub(crate) const STATUS_ACCEPTED: i8 = GoalStatus::STATUS_ACCEPTED as i8;
pub(crate) const STATUS_EXECUTING: i8 = GoalStatus::STATUS_EXECUTING as i8;
pub(crate) const STATUS_CANCELING: i8 = GoalStatus::STATUS_CANCELING as i8;
pub(crate) const STATUS_SUCCEEDED: i8 = GoalStatus::STATUS_SUCCEEDED as i8;
pub(crate) const STATUS_CANCELED: i8 = GoalStatus::STATUS_CANCELED as i8;
pub(crate) const STATUS_ABORTED: i8 = GoalStatus::STATUS_ABORTED as i8;
const CANCEL_NONE: i8 = CancelGoal::Response::ERROR_NONE as i8;
const CANCEL_UNKNOWN_GOAL: i8 = CancelGoal::Response::ERROR_UNKNOWN_GOAL_ID as i8;
const CANCEL_TERMINATED: i8 = CancelGoal::Response::ERROR_GOAL_TERMINATED as i8;

/// A goal id from the wire: exactly 16 bytes, or `None`.
pub(crate) fn goal_id(uuid: &[u8]) -> Option<GoalId> {
    uuid.try_into().ok()
}

fn is_zero(t: &Time) -> bool {
    t.sec == 0 && t.nanosec == 0
}

/// `a` is at or before `b`.
fn not_after(a: &Time, b: &Time) -> bool {
    (a.sec, a.nanosec) <= (b.sec, b.nanosec)
}

/// What a goal table needs of an action's result: whether it succeeded and its error code
/// (which decide the terminal status), and the `busy` result of a `get_result` turned away.
pub(crate) trait GoalResult: Clone + Default {
    fn succeeded(&self) -> bool;
    fn error_code(&self) -> &str;
    fn busy(message: String) -> Self;
}

/// The three results share their `success`, `error_code` and `error_message` fields.
macro_rules! goal_result {
    ($($result:ty),*) => {$(
        impl GoalResult for $result {
            fn succeeded(&self) -> bool {
                self.success
            }
            fn error_code(&self) -> &str {
                &self.error_code
            }
            fn busy(error_message: String) -> Self {
                Self {
                    error_code: ErrorCode::Busy.as_str().to_owned(),
                    error_message,
                    ..Default::default()
                }
            }
        }
    )*};
}

goal_result!(
    Ask::Result,
    crate::msgs::action::Detect::Result,
    crate::msgs::action::Watch::Result
);

struct Goal<W, R> {
    /// When it was accepted (the node's ROS time), as `GoalInfo.stamp` reports it.
    stamp: Time,
    status: i8,
    /// Accept order: the status array lists goals oldest first.
    seq: u64,
    /// Set once the goal is terminal.
    result: Option<R>,
    /// When it ended; `None` (never expires) when the result timeout reaches past what an
    /// `Instant` can hold.
    expires_at: Option<Instant>,
    /// `get_result` requests that arrived before the result.
    waiting: Vec<W>,
}

impl<W, R> Goal<W, R> {
    fn is_terminal(&self) -> bool {
        self.result.is_some()
    }

    fn is_cancelable(&self) -> bool {
        matches!(self.status, STATUS_ACCEPTED | STATUS_EXECUTING)
    }
}

/// Why a goal was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AcceptError {
    #[error(
        "the goal id is not 16 bytes, or all zeros (a cancel request's zero id means every goal)"
    )]
    BadId,
    #[error("a goal with this id is already known")]
    Duplicate,
}

/// Finished goals kept at most, whatever arrives within the result timeout: a flood of goals
/// (each aborted at once with `busy`) cannot grow memory and the status message (28 bytes a
/// goal) without bound. The first to finish goes first. Running goals are bounded by the
/// queue: every goal beyond `queue_depth` ends at once.
pub(crate) const MAX_FINISHED: usize = 4096;

/// `get_result` requests kept waiting for one goal's end; one more is answered at once with
/// the goal's current status and a `busy` result, so a client cannot grow a goal's list
/// without bound.
pub(crate) const MAX_WAITING: usize = 64;

/// The goals the server knows. `W` is a waiting `get_result` request (its responder), `R`
/// the action's result.
pub(crate) struct Goals<W, R = Ask::Result> {
    goals: HashMap<GoalId, Goal<W, R>>,
    /// The finished goals in the order they ended, which is also the order they expire in
    /// (one result timeout for all): expiry and the limit take from the front.
    finished: VecDeque<GoalId>,
    result_timeout: Duration,
    max_finished: usize,
    next_seq: u64,
}

impl<W, R: GoalResult> Goals<W, R> {
    /// A finished goal is forgotten `result_timeout` after its end, or earlier when more than
    /// [`MAX_FINISHED`] have finished since.
    pub(crate) fn new(result_timeout: Duration) -> Self {
        Self::with_limit(result_timeout, MAX_FINISHED)
    }

    /// [`Goals::new`] keeping at most `max_finished` finished goals.
    pub(crate) fn with_limit(result_timeout: Duration, max_finished: usize) -> Self {
        Self {
            goals: HashMap::new(),
            finished: VecDeque::new(),
            result_timeout,
            max_finished,
            next_seq: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.goals.len()
    }

    /// Accepts a new goal, which starts executing at once (the node's queue, not the action
    /// layer, decides when it runs; a goal the queue refuses is aborted with the reason).
    pub(crate) fn accept(&mut self, uuid: &[u8], stamp: Time) -> Result<GoalId, AcceptError> {
        // A zero id could never be cancelled on its own: in a cancel request it means all.
        let id = goal_id(uuid)
            .filter(|id| *id != [0; 16])
            .ok_or(AcceptError::BadId)?;
        if self.goals.contains_key(&id) {
            return Err(AcceptError::Duplicate);
        }
        self.next_seq += 1;
        self.goals.insert(
            id,
            Goal {
                stamp,
                status: STATUS_EXECUTING,
                seq: self.next_seq,
                result: None,
                expires_at: None,
                waiting: Vec::new(),
            },
        );
        Ok(id)
    }

    /// Whether a cancel was accepted for this goal (it is CANCELING or CANCELED).
    #[cfg(test)]
    pub(crate) fn cancel_requested(&self, id: &GoalId) -> bool {
        self.goals
            .get(id)
            .is_some_and(|g| matches!(g.status, STATUS_CANCELING | STATUS_CANCELED))
    }

    /// Processes a cancel request as rcl_action does: a zero id and zero stamp cancel every
    /// goal; a stamp cancels every goal accepted at or before it; an id cancels that goal
    /// (both: the union). Only accepted or executing goals can be cancelled. Returns the
    /// response and the ids now CANCELING, whose generation the caller stops.
    pub(crate) fn cancel(&mut self, info: &GoalInfo) -> (CancelGoal::Response, Vec<GoalId>) {
        let by_id = (!info.goal_id.uuid.iter().all(|b| *b == 0))
            .then(|| goal_id(&info.goal_id.uuid))
            .map(|id| id.filter(|id| self.goals.contains_key(id)));
        let everything = by_id.is_none() && is_zero(&info.stamp);
        let mut return_code = CANCEL_NONE;
        if let Some(id) = &by_id {
            match id.and_then(|id| self.goals.get(&id)) {
                None => return_code = CANCEL_UNKNOWN_GOAL,
                Some(g) if g.is_terminal() => return_code = CANCEL_TERMINATED,
                Some(_) => {}
            }
        }
        let chosen = |id: &GoalId, g: &Goal<W, R>| {
            everything
                || by_id.flatten().as_ref() == Some(id)
                || (!is_zero(&info.stamp) && not_after(&g.stamp, &info.stamp))
        };
        let mut canceling: Vec<(u64, GoalId)> = Vec::new();
        for (id, g) in self.goals.iter_mut() {
            if g.is_cancelable() && chosen(id, g) {
                g.status = STATUS_CANCELING;
                canceling.push((g.seq, *id));
            }
        }
        canceling.sort_unstable();
        let goals_canceling = canceling
            .iter()
            .filter_map(|(_, id)| self.info(id))
            .collect();
        // A goal matched by its stamp makes the request succeed even when the id did not.
        if !canceling.is_empty() {
            return_code = CANCEL_NONE;
        }
        let response = CancelGoal::Response {
            return_code,
            goals_canceling,
        };
        (response, canceling.into_iter().map(|(_, id)| id).collect())
    }

    /// Ends a goal with its result: SUCCEEDED when the answer completed, CANCELED when it
    /// stopped by cancel after the goal's cancel was accepted, ABORTED otherwise. Returns the
    /// terminal status and the waiting `get_result` requests to answer with it. A goal
    /// already ended keeps its result and status (nothing waits for it any more).
    pub(crate) fn finish(&mut self, id: &GoalId, result: R, now: Instant) -> (i8, Vec<W>) {
        let Some(g) = self.goals.get_mut(id) else {
            return (STATUS_UNKNOWN, Vec::new());
        };
        if g.is_terminal() {
            return (g.status, Vec::new());
        }
        let status = if result.succeeded() {
            STATUS_SUCCEEDED
        } else if g.status == STATUS_CANCELING
            && result.error_code() == ErrorCode::Cancelled.as_str()
        {
            STATUS_CANCELED
        } else {
            STATUS_ABORTED
        };
        g.status = status;
        g.result = Some(result);
        // Never before the goal that ended last: the queue stays in expiry order even if a
        // caller's clock were not monotonic.
        let latest = self
            .finished
            .back()
            .and_then(|last| self.goals.get(last))
            .and_then(|last| last.expires_at);
        let Some(g) = self.goals.get_mut(id) else {
            return (STATUS_UNKNOWN, Vec::new());
        };
        g.expires_at = now
            .checked_add(self.result_timeout)
            .map(|at| latest.map_or(at, |l| at.max(l)));
        let waiting = std::mem::take(&mut g.waiting);
        self.finished.push_back(*id);
        while self.finished.len() > self.max_finished {
            self.forget_oldest_finished();
        }
        (status, waiting)
    }

    fn forget_oldest_finished(&mut self) {
        if let Some(id) = self.finished.pop_front() {
            self.goals.remove(&id);
        }
    }

    /// A `get_result` request: the waiter, status and result to answer with now when the
    /// goal has ended or is unknown (status UNKNOWN, an empty result); `None` when it is
    /// kept until [`Goals::finish`].
    pub(crate) fn get_result(&mut self, uuid: &[u8], waiter: W) -> Option<(W, i8, R)> {
        match goal_id(uuid).and_then(|id| self.goals.get_mut(&id)) {
            None => Some((waiter, STATUS_UNKNOWN, R::default())),
            Some(g) => match &g.result {
                Some(r) => Some((waiter, g.status, r.clone())),
                None if g.waiting.len() >= MAX_WAITING => {
                    let busy = R::busy(format!(
                        "{MAX_WAITING} get_result requests already wait for this goal; ask \
                         again later"
                    ));
                    Some((waiter, g.status, busy))
                }
                None => {
                    g.waiting.push(waiter);
                    None
                }
            },
        }
    }

    /// Forgets every goal that ended at least the result timeout ago; true when any went.
    pub(crate) fn expire(&mut self, now: Instant) -> bool {
        let before = self.goals.len();
        while self.next_expiry().is_some_and(|at| at <= now) {
            self.forget_oldest_finished();
        }
        self.goals.len() != before
    }

    /// When the next finished goal expires; `None` when none has finished or the next one
    /// never expires (a result timeout past what an `Instant` can hold).
    pub(crate) fn next_expiry(&self) -> Option<Instant> {
        let first = self.finished.front()?;
        self.goals.get(first)?.expires_at
    }

    /// The `_action/status` message: every known goal, oldest first.
    pub(crate) fn status_array(&self) -> GoalStatusArray {
        let mut goals: Vec<_> = self.goals.iter().collect();
        goals.sort_unstable_by_key(|(_, g)| g.seq);
        GoalStatusArray {
            status_list: goals
                .into_iter()
                .map(|(id, g)| GoalStatus {
                    goal_info: goal_info(id, &g.stamp),
                    status: g.status,
                })
                .collect(),
        }
    }

    fn info(&self, id: &GoalId) -> Option<GoalInfo> {
        self.goals.get(id).map(|g| goal_info(id, &g.stamp))
    }
}

fn goal_info(id: &GoalId, stamp: &Time) -> GoalInfo {
    GoalInfo {
        goal_id: r2r::unique_identifier_msgs::msg::UUID { uuid: id.to_vec() },
        stamp: stamp.clone(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn t(sec: i32) -> Time {
        Time { sec, nanosec: 0 }
    }

    fn uuid(n: u8) -> Vec<u8> {
        vec![n; 16]
    }

    fn info(id: Option<u8>, stamp: i32) -> GoalInfo {
        GoalInfo {
            goal_id: r2r::unique_identifier_msgs::msg::UUID {
                uuid: id.map_or_else(|| vec![0; 16], uuid),
            },
            stamp: t(stamp),
        }
    }

    fn result(success: bool, code: &str) -> Ask::Result {
        Ask::Result {
            success,
            error_code: code.to_owned(),
            ..Default::default()
        }
    }

    fn statuses(g: &Goals<u32>) -> Vec<(u8, i8)> {
        g.status_array()
            .status_list
            .iter()
            .map(|s| (s.goal_info.goal_id.uuid[0], s.status))
            .collect()
    }

    #[test]
    fn ids_must_be_16_bytes_and_new() {
        let mut g = Goals::<u32>::new(Duration::from_secs(1));
        assert_eq!(g.accept(&[1; 15], t(1)), Err(AcceptError::BadId));
        // All zeros: a cancel request with this id would cancel every goal, not this one.
        assert_eq!(g.accept(&[0; 16], t(1)), Err(AcceptError::BadId));
        g.accept(&uuid(1), t(1)).unwrap();
        assert_eq!(g.accept(&uuid(1), t(2)), Err(AcceptError::Duplicate));
        assert_eq!(statuses(&g), vec![(1, STATUS_EXECUTING)]);
    }

    #[test]
    fn cancel_by_id_stamp_or_all_as_rcl_action() {
        let mut g = Goals::<u32>::new(Duration::from_secs(1));
        for n in 1..=4 {
            g.accept(&uuid(n), t(i32::from(n) * 10)).unwrap();
        }
        let (r, ids) = g.cancel(&info(Some(9), 0));
        assert_eq!((r.return_code, ids.len()), (CANCEL_UNKNOWN_GOAL, 0));
        let (r, ids) = g.cancel(&info(Some(2), 0));
        assert_eq!((r.return_code, ids), (CANCEL_NONE, vec![[2; 16]]));
        assert!(g.cancel_requested(&[2; 16]));
        // Stamp 30: goals 1 and 3 (2 is already canceling), not 4.
        let (r, ids) = g.cancel(&info(None, 30));
        assert_eq!((r.return_code, ids), (CANCEL_NONE, vec![[1; 16], [3; 16]]));
        assert_eq!(r.goals_canceling.len(), 2);
        g.finish(&[4; 16], result(true, ""), Instant::now());
        let (r, _) = g.cancel(&info(Some(4), 0));
        assert_eq!(r.return_code, CANCEL_TERMINATED);
        // Everything: nothing cancelable is left, which is no error.
        let (r, ids) = g.cancel(&info(None, 0));
        assert_eq!((r.return_code, ids.len()), (CANCEL_NONE, 0));
    }

    #[test]
    fn terminal_status_follows_the_result_and_the_cancel() {
        let mut g = Goals::<u32>::new(Duration::from_secs(1));
        let now = Instant::now();
        for n in 1..=4 {
            g.accept(&uuid(n), t(1)).unwrap();
        }
        g.cancel(&info(Some(1), 0));
        g.cancel(&info(Some(3), 0));
        assert_eq!(
            g.finish(&[1; 16], result(false, "cancelled"), now).0,
            STATUS_CANCELED
        );
        // Cancelled through vlm/cancel, not the action: the protocol has no way to CANCELED.
        assert_eq!(
            g.finish(&[2; 16], result(false, "cancelled"), now).0,
            STATUS_ABORTED
        );
        // The answer completed before the cancel reached it.
        assert_eq!(
            g.finish(&[3; 16], result(true, ""), now).0,
            STATUS_SUCCEEDED
        );
        assert_eq!(
            g.finish(&[4; 16], result(false, "busy"), now).0,
            STATUS_ABORTED
        );
        assert_eq!(g.finish(&[9; 16], result(true, ""), now).0, STATUS_UNKNOWN);
    }

    #[test]
    fn results_wait_for_the_end_and_unknown_goals_answer_at_once() {
        let mut g = Goals::<u32>::new(Duration::from_secs(1));
        g.accept(&uuid(1), t(1)).unwrap();
        assert!(g.get_result(&uuid(1), 7).is_none());
        assert!(g.get_result(&uuid(1), 8).is_none());
        match g.get_result(&uuid(2), 9) {
            Some((9, STATUS_UNKNOWN, r)) => assert!(!r.success),
            _ => panic!("an unknown goal is answered at once"),
        }
        let (status, waiting) = g.finish(&[1; 16], result(true, ""), Instant::now());
        assert_eq!((status, waiting), (STATUS_SUCCEEDED, vec![7, 8]));
        match g.get_result(&uuid(1), 10) {
            Some((10, STATUS_SUCCEEDED, r)) => assert!(r.success),
            _ => panic!("a finished goal is answered at once"),
        }
    }

    /// At most [`MAX_WAITING`] `get_result` requests wait for one goal; the next is answered
    /// at once with the goal's status and a `busy` result, and the waiting ones still get
    /// the real result.
    #[test]
    fn waiting_results_are_capped_per_goal() {
        let mut g = Goals::<usize>::new(Duration::from_secs(1));
        g.accept(&uuid(1), t(1)).unwrap();
        g.accept(&uuid(2), t(1)).unwrap();
        for w in 0..MAX_WAITING {
            assert!(g.get_result(&uuid(1), w).is_none(), "{w}");
        }
        match g.get_result(&uuid(1), 999) {
            Some((999, STATUS_EXECUTING, r)) => {
                assert!(!r.success);
                assert_eq!(r.error_code, "busy");
                assert!(r.error_message.contains("64"), "{}", r.error_message);
            }
            _ => panic!("one over the cap is answered at once"),
        }
        assert!(g.get_result(&uuid(2), 1000).is_none(), "per goal");
        let (_, waiting) = g.finish(&[1; 16], result(true, ""), Instant::now());
        assert_eq!(waiting, (0..MAX_WAITING).collect::<Vec<_>>());
        assert!(matches!(
            g.get_result(&uuid(1), 1001),
            Some((1001, STATUS_SUCCEEDED, _))
        ));
    }

    /// Finished goals are forgotten in the order they ended (which is the order they expire
    /// in), however they were accepted.
    #[test]
    fn beyond_the_limit_the_first_finished_goal_goes_first() {
        let mut g = Goals::<u32>::with_limit(Duration::from_secs(900), 2);
        let now = Instant::now();
        for n in 1..=5 {
            g.accept(&uuid(n), t(1)).unwrap();
        }
        // Goal 2 ends first though accepted after goal 1: it goes first.
        for n in [2, 1, 4] {
            g.finish(&[n; 16], result(true, ""), now);
        }
        assert_eq!(
            statuses(&g),
            vec![
                (1, STATUS_SUCCEEDED),
                (3, STATUS_EXECUTING),
                (4, STATUS_SUCCEEDED),
                (5, STATUS_EXECUTING)
            ]
        );
        // A second finish of an ended goal changes nothing (and is not counted twice).
        let (status, _) = g.finish(&[4; 16], result(false, "busy"), now);
        assert_eq!(status, STATUS_SUCCEEDED);
        g.finish(&[5; 16], result(true, ""), now);
        assert_eq!(
            statuses(&g),
            vec![
                (3, STATUS_EXECUTING),
                (4, STATUS_SUCCEEDED),
                (5, STATUS_SUCCEEDED)
            ]
        );
        assert_eq!(g.len(), 3);
    }

    /// A result timeout too long for an `Instant` means the goal never expires (it used to
    /// panic in `Instant + Duration`).
    #[test]
    fn a_result_timeout_past_an_instant_never_expires() {
        for timeout in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
            let mut g = Goals::<u32>::new(timeout);
            let now = Instant::now();
            g.accept(&uuid(1), t(1)).unwrap();
            g.finish(&[1; 16], result(true, ""), now);
            assert_eq!(g.next_expiry(), None);
            assert!(!g.expire(now + Duration::from_secs(1 << 40)));
            assert_eq!(g.len(), 1);
        }
    }

    #[test]
    fn finished_goals_expire_after_the_result_timeout_running_ones_never() {
        let mut g = Goals::<u32>::new(Duration::from_secs(10));
        let t0 = Instant::now();
        g.accept(&uuid(1), t(1)).unwrap();
        g.accept(&uuid(2), t(2)).unwrap();
        g.accept(&uuid(3), t(3)).unwrap();
        g.finish(&[1; 16], result(true, ""), t0);
        g.finish(&[3; 16], result(true, ""), t0 + Duration::from_secs(5));
        assert_eq!(g.next_expiry(), Some(t0 + Duration::from_secs(10)));
        assert!(!g.expire(t0 + Duration::from_secs(9)));
        assert!(g.expire(t0 + Duration::from_secs(10)));
        assert_eq!(
            statuses(&g),
            vec![(2, STATUS_EXECUTING), (3, STATUS_SUCCEEDED)]
        );
        assert!(g.expire(t0 + Duration::from_secs(1000)));
        assert_eq!(statuses(&g), vec![(2, STATUS_EXECUTING)]);
        assert_eq!(g.next_expiry(), None);
    }
}
