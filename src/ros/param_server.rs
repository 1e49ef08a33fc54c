//! The node's parameters served over the ROS parameter services (`ros2 param list/get/
//! describe/set/dump`): r2r's [`RosParams`] implemented over [`Params`]' own validation, so a
//! run-time set passes exactly the checks a params file does. A set is refused (with the
//! reason) when the parameter is read at start only ([`Apply::Restart`]), the value has the
//! wrong type or is out of range; an accepted one replaces the [`LiveParams`] snapshot that
//! each ask takes, so it applies to the next ask. The values are never taken from r2r's
//! parameter event stream: that channel drops events when it is full.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use r2r::indexmap::IndexMap;
use r2r::{Parameter, ParameterValue, RosParams};

use crate::process::panics::{contained, Panic};
use crate::ros::lifecycle::{Lifecycle, StateId};
use crate::ros::params::{spec, Apply, Kind, ParamError, Params, Spec, SPECS};

/// The current parameters, shared by the parameter services (which replace them) and the
/// ask path (which takes a snapshot per ask).
#[derive(Clone)]
pub struct LiveParams(Arc<RwLock<Arc<Params>>>);

impl LiveParams {
    pub fn new(p: Params) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(p))))
    }

    /// The parameters as they are now; later sets do not change this snapshot. A lock
    /// poisoned by a panic still holds a whole `Arc<Params>` (it is replaced in one store).
    pub fn snapshot(&self) -> Arc<Params> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn store(&self, p: Params) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(p);
    }
}

/// Why a parameter set is refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("`{0}` is not a parameter of vlm_node")]
    Unknown(String),
    #[error("`{0}` is read at start only: restart the node with the new value (params file or -p {0}:=...)")]
    RestartOnly(&'static str),
    #[error(transparent)]
    Invalid(#[from] ParamError),
    /// A bug in the checks: the set is refused instead of ending the node (r2r runs these
    /// handlers where a panic is fatal).
    #[error("internal error while checking the value: {0}")]
    Panicked(Panic),
}

impl Refusal {
    fn into_r2r(self, name: &str) -> r2r::Error {
        match self {
            Refusal::Unknown(name) => r2r::Error::InvalidParameterName { name },
            other => r2r::Error::ParameterValueConv {
                name: name.to_owned(),
                msg: other.to_string(),
            },
        }
    }
}

/// The description `ros2 param describe` shows, rendered from the parameter's declaration:
/// its text, its accepted values and when a new value takes effect. r2r 0.9.7's describe
/// service fills only a descriptor's description (and its type, from the value), so the
/// range and the read-only rule travel in this text rather than in `integer_range`,
/// `floating_point_range` and `read_only`.
pub fn description(spec: &Spec) -> String {
    let values = match (spec.kind, spec.kind.range()) {
        (_, None) => String::new(),
        (Kind::Choice(_), Some(names)) => format!(" One of: {names}."),
        (_, Some(range)) => format!(" Range: {range}."),
    };
    let applies = match spec.apply {
        Apply::NextAsk => "Settable at run time (ros2 param set): applies to the next ask.",
        Apply::Restart => {
            "Read at start only: a run-time set is refused; restart the node to change it."
        }
        Apply::Configure => {
            "Read at start only, and at each configure: a run-time set is refused unless the \
             node is unconfigured (docs/lifecycle.md); then it applies at the next configure."
        }
    };
    format!("{}{values} {applies}", spec.description)
}

/// [`description`] of the `index`th parameter, built once: r2r keeps descriptions as
/// `&'static str`.
fn described(index: usize) -> &'static str {
    static TEXTS: OnceLock<Vec<String>> = OnceLock::new();
    let texts = TEXTS.get_or_init(|| SPECS.iter().map(description).collect());
    texts.get(index).map_or("", String::as_str)
}

/// `vlm_node`'s parameters for r2r's parameter services
/// ([`r2r::Node::make_derived_parameter_handler`]).
pub struct ParamServer {
    live: LiveParams,
    /// `use_sim_time` as the node started with it (the clock is chosen once, at start).
    use_sim_time: bool,
    /// The node's lifecycle state: an unconfigured node takes [`Apply::Configure`] sets.
    lifecycle: Lifecycle,
}

/// ROS's own parameter, read at start by the node's clock (`crate::clock`).
const USE_SIM_TIME: &str = "use_sim_time";

impl ParamServer {
    pub fn new(live: LiveParams, use_sim_time: bool) -> Self {
        Self {
            live,
            use_sim_time,
            lifecycle: Lifecycle::active(),
        }
    }

    /// The server of a managed node in `lifecycle`'s state.
    pub fn with_lifecycle(mut self, lifecycle: Lifecycle) -> Self {
        self.lifecycle = lifecycle;
        self
    }

    /// The parameters after setting `name` to `value`, checked as a params file would be;
    /// `None` when the value is the one in force (also for a restart-only parameter, so
    /// `ros2 param load` of a `ros2 param dump` succeeds on an unchanged node).
    pub fn candidate(&self, name: &str, value: &ParameterValue) -> Result<Option<Params>, Refusal> {
        if name == USE_SIM_TIME {
            return match value {
                ParameterValue::Bool(b) if *b == self.use_sim_time => Ok(None),
                _ => Err(Refusal::RestartOnly(USE_SIM_TIME)),
            };
        }
        let spec = spec(name).ok_or_else(|| Refusal::Unknown(name.to_owned()))?;
        // `ros2 param delete` sends "not set"; every parameter of the node always has a value.
        if *value == ParameterValue::NotSet {
            return Err(Refusal::Invalid(ParamError {
                name: spec.name,
                reason: "cannot be deleted (unset)".into(),
            }));
        }
        let now = self.live.snapshot();
        let mut given: HashMap<String, ParameterValue> = now
            .effective()
            .into_iter()
            .map(|(n, v)| (n.to_owned(), v))
            .collect();
        given.insert(name.to_owned(), value.clone());
        let next = Params::from_values(&given)?;
        if next == *now {
            return Ok(None);
        }
        match spec.apply {
            Apply::Configure if self.lifecycle.state() == StateId::UNCONFIGURED => Ok(Some(next)),
            Apply::Restart | Apply::Configure => Err(Refusal::RestartOnly(spec.name)),
            Apply::NextAsk => Ok(Some(next)),
        }
    }

    /// Sets `name` to `value` for the next ask, or says why not.
    pub fn set(&self, name: &str, value: &ParameterValue) -> Result<(), Refusal> {
        match self.candidate(name, value) {
            Ok(Some(next)) => {
                self.live.store(next);
                tracing::info!(
                    parameter = name,
                    ?value,
                    "parameter set: applies to the next ask"
                );
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => {
                tracing::info!(parameter = name, ?value, "parameter set refused: {e}");
                Err(e)
            }
        }
    }

    /// The value in force of `name`.
    pub fn get(&self, name: &str) -> Option<ParameterValue> {
        self.live
            .snapshot()
            .effective()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
    }
}

impl RosParams for ParamServer {
    /// Lists every parameter with its value in force (the command line and params file were
    /// applied by [`Params::from_values`] before) and its description; other entries of the
    /// node's map (`use_sim_time`) stay as they are.
    fn register_parameters(
        &mut self,
        prefix: &str,
        _param: Option<Parameter>,
        params: &mut IndexMap<String, Parameter>,
    ) -> r2r::Result<()> {
        if !prefix.is_empty() {
            return Err(r2r::Error::InvalidParameterName {
                name: prefix.to_owned(),
            });
        }
        let values = self.live.snapshot().effective();
        for (name, value) in values {
            let description = SPECS
                .iter()
                .position(|s| s.name == name)
                .map_or("", described);
            params.shift_remove(name);
            params.insert(name.to_owned(), Parameter { value, description });
        }
        Ok(())
    }

    fn get_parameter(&mut self, name: &str) -> r2r::Result<ParameterValue> {
        self.get(name)
            .ok_or_else(|| r2r::Error::InvalidParameterName {
                name: name.to_owned(),
            })
    }

    fn set_parameter(&mut self, name: &str, value: &ParameterValue) -> r2r::Result<()> {
        contained(|| self.set(name, value))
            .unwrap_or_else(|p| Err(Refusal::Panicked(p)))
            .map_err(|e| e.into_r2r(name))
    }

    fn check_parameter(&self, name: &str, value: &ParameterValue) -> r2r::Result<()> {
        contained(|| self.candidate(name, value).map(|_| ()))
            .unwrap_or_else(|p| Err(Refusal::Panicked(p)))
            .map_err(|e| e.into_r2r(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> ParamServer {
        let p = Params::from_values(&HashMap::new()).unwrap();
        ParamServer::new(LiveParams::new(p), false)
    }

    fn d(x: f64) -> ParameterValue {
        ParameterValue::Double(x)
    }

    #[test]
    fn a_run_time_parameter_applies_to_the_next_snapshot() {
        let s = server();
        let before = s.live.snapshot();
        s.set("temperature", &d(0.0)).unwrap();
        assert_eq!(before.temperature, 0.7, "a taken snapshot does not change");
        assert_eq!(s.live.snapshot().temperature, 0.0);
        assert_eq!(s.get("temperature"), Some(d(0.0)));
        // An integer is a double's value too (`ros2 param set ... 0` sends an integer).
        s.set("max_image_age_s", &ParameterValue::Integer(2))
            .unwrap();
        assert_eq!(s.get("max_image_age_s"), Some(d(2.0)));
        s.set("system_prompt", &ParameterValue::String("Be brief.".into()))
            .unwrap();
        assert_eq!(
            s.live.snapshot().system_prompt.as_deref(),
            Some("Be brief.")
        );
        s.set("max_json_schema_bytes", &ParameterValue::Integer(0))
            .unwrap();
        assert_eq!(s.live.snapshot().max_json_schema_bytes, 0);
    }

    #[test]
    fn model_settings_are_set_only_while_unconfigured() {
        let lifecycle = Lifecycle::default();
        let s = server().with_lifecycle(lifecycle.clone());
        let dir = ParameterValue::String("/m".into());
        s.set("model_dir", &dir).unwrap();
        assert_eq!(s.live.snapshot().model_dir, Some("/m".into()));
        // Configured (or serving): refused as before there were lifecycle states.
        lifecycle.force(StateId::INACTIVE);
        let e = s.set("model_dir", &ParameterValue::String("/n".into()));
        assert!(matches!(e, Err(Refusal::RestartOnly("model_dir"))), "{e:?}");
        let e = s.set("queue_depth", &ParameterValue::Integer(8));
        assert!(
            matches!(e, Err(Refusal::RestartOnly("queue_depth"))),
            "{e:?}"
        );
        lifecycle.force(StateId::UNCONFIGURED);
        let e = s.set("queue_depth", &ParameterValue::Integer(8));
        assert!(
            matches!(e, Err(Refusal::RestartOnly("queue_depth"))),
            "{e:?}"
        );
    }

    #[test]
    fn restart_only_wrong_type_and_out_of_range_are_refused_with_the_reason() {
        let s = server();
        let e = s
            .set("model_dir", &ParameterValue::String("/opt/m".into()))
            .unwrap_err();
        assert!(matches!(e, Refusal::RestartOnly("model_dir")), "{e}");
        assert!(e.to_string().contains("restart"), "{e}");
        let e = s
            .set("queue_depth", &ParameterValue::Integer(8))
            .unwrap_err();
        assert!(matches!(e, Refusal::RestartOnly("queue_depth")), "{e}");
        // The value in force is no change, so loading a dump back succeeds.
        s.set("queue_depth", &ParameterValue::Integer(4)).unwrap();
        s.set(
            "image_topics",
            &ParameterValue::StringArray(vec!["image_raw".into()]),
        )
        .unwrap();

        let e = s
            .set("temperature", &ParameterValue::String("hot".into()))
            .unwrap_err();
        assert!(e.to_string().contains("expected a number"), "{e}");
        let e = s.set("temperature", &d(-0.5)).unwrap_err();
        assert!(e.to_string().contains(">= 0"), "{e}");
        let e = s.set("top_p", &d(1.5)).unwrap_err();
        assert!(e.to_string().contains("(0, 1]"), "{e}");
        let e = s
            .set("max_new_tokens", &ParameterValue::Integer(0))
            .unwrap_err();
        assert!(e.to_string().contains("1..=32768"), "{e}");
        // In range as an f64, inf or 0 as the f32 the sampler holds.
        for (name, bad) in [
            ("temperature", 1e39),
            ("repetition_penalty", 1e39),
            ("top_p", 1e-46),
        ] {
            let e = s.set(name, &d(bad)).unwrap_err();
            assert!(e.to_string().contains(name), "{e}");
            assert!(e.to_string().contains("32-bit"), "{e}");
        }
        let e = s.set("request_timeout_s", &d(f64::NAN)).unwrap_err();
        assert!(e.to_string().contains("request_timeout_s"), "{e}");
        let e = s.set("top_k", &ParameterValue::NotSet).unwrap_err();
        assert!(e.to_string().contains("cannot be deleted"), "{e}");
        let e = s
            .set("enable_thinking", &ParameterValue::Integer(1))
            .unwrap_err();
        assert!(e.to_string().contains("a bool"), "{e}");
        assert!(matches!(
            s.set("nope", &d(1.0)).unwrap_err(),
            Refusal::Unknown(_)
        ));
        // Nothing refused reached the parameters.
        assert_eq!(
            *s.live.snapshot(),
            Params::from_values(&HashMap::new()).unwrap()
        );
    }

    #[test]
    fn check_does_not_set_and_r2r_gets_the_reason() {
        let mut s = server();
        s.check_parameter("temperature", &d(0.1)).unwrap();
        assert_eq!(s.live.snapshot().temperature, 0.7);
        let e = s.check_parameter("top_k", &d(3.0)).unwrap_err();
        assert!(e.to_string().contains("expected an integer"), "{e}");
        let e = s
            .set_parameter("vision", &ParameterValue::Bool(false))
            .unwrap_err();
        assert!(e.to_string().contains("read at start only"), "{e}");
        // use_sim_time is r2r's entry (get falls back to the node's map); the clock is
        // chosen at start, so only its value in force is accepted.
        assert!(s.get_parameter("use_sim_time").is_err());
        s.set_parameter("use_sim_time", &ParameterValue::Bool(false))
            .unwrap();
        let e = s
            .set_parameter("use_sim_time", &ParameterValue::Bool(true))
            .unwrap_err();
        assert!(e.to_string().contains("read at start only"), "{e}");
    }

    /// Every parameter is listed once, in the table's order, with a description that says
    /// when a new value applies; the values read back build the same parameters (what
    /// `ros2 param dump` writes is a params file the node accepts).
    #[test]
    fn registration_lists_every_parameter_and_the_values_round_trip() {
        let mut s = server();
        let mut map = IndexMap::new();
        map.insert(
            "use_sim_time".to_owned(),
            Parameter::new(ParameterValue::Bool(false)),
        );
        map.insert("temperature".to_owned(), Parameter::new(d(0.2)));
        s.register_parameters("", None, &mut map).unwrap();
        let names: Vec<_> = map.keys().cloned().collect();
        let mut want = vec!["use_sim_time".to_owned()];
        want.extend(SPECS.iter().map(|s| s.name.to_owned()));
        assert_eq!(names, want);
        assert_eq!(
            map["temperature"].value,
            d(0.7),
            "the validated value is listed"
        );
        for spec in SPECS {
            let text = map[spec.name].description;
            assert!(text.starts_with(spec.description), "{}", spec.name);
            let tail = match spec.apply {
                Apply::NextAsk => "applies to the next ask.",
                Apply::Restart => "restart the node to change it.",
                Apply::Configure => "applies at the next configure.",
            };
            assert!(text.ends_with(tail), "{}: {text}", spec.name);
        }
        assert_eq!(
            map["compressed_image_topics"].value,
            ParameterValue::StringArray(vec![String::new()])
        );
        let dumped: HashMap<String, ParameterValue> = map
            .iter()
            .filter(|(n, _)| spec(n).is_some())
            .map(|(n, p)| (n.clone(), p.value.clone()))
            .collect();
        assert_eq!(Params::from_values(&dumped).unwrap(), *s.live.snapshot());
    }

    /// A declared range or choice reaches `ros2 param describe`.
    #[test]
    fn descriptions_carry_the_declared_values() {
        for spec in SPECS {
            let text = description(spec);
            if let Some(range) = spec.kind.range() {
                assert!(text.contains(&range), "{}: {text}", spec.name);
            }
        }
        let top_p = spec("top_p").map(description).unwrap();
        assert!(top_p.contains("Range: (0, 1]."), "{top_p}");
        let backend = spec("backend").map(description).unwrap();
        assert!(backend.contains("One of: auto, cpu."), "{backend}");
    }

    /// The parameter table of docs/parameters.md says for each parameter when a new value applies, as
    /// the table in `params.rs` decides.
    #[test]
    fn the_parameter_table_marks_the_run_time_parameters() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let readme = std::fs::read_to_string(root.join("docs/parameters.md")).unwrap();
        for spec in SPECS {
            let head = format!("| `{}` |", spec.name);
            let row = readme.lines().find(|l| l.starts_with(&head)).unwrap();
            let want = match spec.apply {
                Apply::NextAsk => "| next ask |",
                Apply::Restart => "| restart |",
                Apply::Configure => "| restart or configure |",
            };
            assert!(
                row.ends_with(want),
                "docs/parameters.md row of {}: {row}",
                spec.name
            );
        }
    }
}
