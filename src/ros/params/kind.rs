//! What a declared parameter may hold ([`Kind`]) and how a ROS value becomes the typed field
//! of [`Params`](super::Params) and back ([`Param`]): one place for the checks and the
//! refusal messages, so every parameter of a kind is read, refused and documented alike.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use r2r::ParameterValue;

use super::{time_limit, BackendChoice, CameraQos, ParamError};

/// The values a parameter accepts; the *range* column of docs/parameters.md and `ros2 param describe`
/// are rendered from it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Bool,
    /// Any string.
    Text,
    /// A list of topic names (a single string is a list of one); empty ones are dropped.
    Topics,
    /// One of these names (the first spelling of each value).
    Choice(&'static [&'static str]),
    /// An integer in `min..=max`.
    Int {
        min: i64,
        max: i64,
    },
    /// An integer count of MiB in `min..=max`, held in bytes.
    Mebibytes {
        min: i64,
        max: i64,
    },
    /// A finite number in the span (an integer is accepted for it).
    Real(Span),
    /// A time in seconds in the span that also fits a `Duration` and a deadline
    /// ([`time_limit`]).
    Seconds(Span),
    /// A BPU call timeout in seconds, checked by `vlm_bpu::timeout_from_secs`.
    BpuSeconds,
}

/// One end of a [`Span`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    None,
    Incl(f64),
    Excl(f64),
}

/// A range of numbers, spelled as in the refusal messages (`>= 0`, `(0, 1]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    pub lo: Bound,
    pub hi: Bound,
}

/// `>= 0`.
pub const AT_LEAST_0: Span = Span {
    lo: Bound::Incl(0.0),
    hi: Bound::None,
};
/// `> 0`.
pub const ABOVE_0: Span = Span {
    lo: Bound::Excl(0.0),
    hi: Bound::None,
};
/// `(0, 1]`.
pub const SHARE: Span = Span {
    lo: Bound::Excl(0.0),
    hi: Bound::Incl(1.0),
};
/// `[lo, hi]`.
pub const fn closed(lo: f64, hi: f64) -> Span {
    Span {
        lo: Bound::Incl(lo),
        hi: Bound::Incl(hi),
    }
}

/// The longest BPU call timeout `vlm_bpu::timeout_from_secs` accepts (hbUCP's i32 ms).
const BPU_MAX_S: f64 = i32::MAX as f64 / 1000.0;

impl Span {
    pub fn contains(&self, x: f64) -> bool {
        let lo = match self.lo {
            Bound::None => true,
            Bound::Incl(b) => x >= b,
            Bound::Excl(b) => x > b,
        };
        let hi = match self.hi {
            Bound::None => true,
            Bound::Incl(b) => x <= b,
            Bound::Excl(b) => x < b,
        };
        lo && hi
    }

    /// What a refused value "is not": `>= 0`, or `in (0, 1]` for a span with two ends.
    fn want(&self) -> String {
        match (self.lo, self.hi) {
            (Bound::None, _) | (_, Bound::None) => self.to_string(),
            _ => format!("in {self}"),
        }
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.lo, self.hi) {
            (Bound::None, Bound::None) => f.write_str("any number"),
            (Bound::Incl(b), Bound::None) => write!(f, ">= {b}"),
            (Bound::Excl(b), Bound::None) => write!(f, "> {b}"),
            (Bound::None, Bound::Incl(b)) => write!(f, "<= {b}"),
            (Bound::None, Bound::Excl(b)) => write!(f, "< {b}"),
            (Bound::Incl(a) | Bound::Excl(a), Bound::Incl(b) | Bound::Excl(b)) => {
                let open = if matches!(self.lo, Bound::Excl(_)) {
                    '('
                } else {
                    '['
                };
                let close = if matches!(self.hi, Bound::Excl(_)) {
                    ')'
                } else {
                    ']'
                };
                write!(f, "{open}{a}, {b}{close}")
            }
        }
    }
}

impl Kind {
    /// The accepted values as the range column of docs/parameters.md and `ros2 param describe` spell
    /// them; `None` when the type says it all (a bool, a string, a topic list).
    pub fn range(&self) -> Option<String> {
        match self {
            Kind::Bool | Kind::Text | Kind::Topics => None,
            Kind::Choice(names) => Some(names.join(", ")),
            Kind::Int { min, max } => Some(format!("{min}..={max}")),
            Kind::Mebibytes { min, max } => Some(format!("{min}..={max} MiB")),
            Kind::Real(span) | Kind::Seconds(span) => Some(span.to_string()),
            Kind::BpuSeconds => Some(format!("(0, {BPU_MAX_S}]")),
        }
    }
}

fn bad(name: &'static str, want: &str, got: &ParameterValue) -> ParamError {
    ParamError {
        name,
        reason: format!("expected {want}, got {got:?}"),
    }
}

/// A declaration whose kind does not fit its field's type: a bug the defaults test catches.
fn misdeclared(name: &'static str, kind: &Kind) -> ParamError {
    ParamError {
        name,
        reason: format!("declared as {kind:?}, which its field cannot hold"),
    }
}

fn string(name: &'static str, v: ParameterValue) -> Result<String, ParamError> {
    match v {
        ParameterValue::String(s) => Ok(s),
        v => Err(bad(name, "a string", &v)),
    }
}

fn int(name: &'static str, kind: &Kind, v: ParameterValue) -> Result<i64, ParamError> {
    let (Kind::Int { min, max } | Kind::Mebibytes { min, max }) = *kind else {
        return Err(misdeclared(name, kind));
    };
    match v {
        ParameterValue::Integer(i) if (min..=max).contains(&i) => Ok(i),
        ParameterValue::Integer(i) => Err(ParamError {
            name,
            reason: format!("{i} is outside {min}..={max}"),
        }),
        v => Err(bad(name, "an integer", &v)),
    }
}

/// A number; integers are accepted for doubles (`max_image_age_s: 0` in YAML is an integer).
fn number(name: &'static str, v: ParameterValue) -> Result<f64, ParamError> {
    match v {
        ParameterValue::Double(d) => Ok(d),
        ParameterValue::Integer(i) => Ok(i as f64),
        v => Err(bad(name, "a number", &v)),
    }
}

/// A finite number in `span`.
fn double(name: &'static str, span: &Span, v: ParameterValue) -> Result<f64, ParamError> {
    let x = number(name, v)?;
    if x.is_finite() && span.contains(x) {
        Ok(x)
    } else {
        Err(ParamError {
            name,
            reason: format!("{x} is not {}", span.want()),
        })
    }
}

fn a_string(s: &str) -> ParameterValue {
    ParameterValue::String(s.to_owned())
}

/// A field of [`Params`](super::Params) read from a parameter of kind `kind` and written
/// back as the value `ros2 param get` shows.
pub(super) trait Param: Sized {
    fn read(name: &'static str, kind: &Kind, v: ParameterValue) -> Result<Self, ParamError>;
    fn value(&self, kind: &Kind) -> ParameterValue;
}

impl Param for bool {
    fn read(name: &'static str, _: &Kind, v: ParameterValue) -> Result<Self, ParamError> {
        match v {
            ParameterValue::Bool(b) => Ok(b),
            v => Err(bad(name, "a bool", &v)),
        }
    }
    fn value(&self, _: &Kind) -> ParameterValue {
        ParameterValue::Bool(*self)
    }
}

impl Param for String {
    fn read(name: &'static str, _: &Kind, v: ParameterValue) -> Result<Self, ParamError> {
        string(name, v)
    }
    fn value(&self, _: &Kind) -> ParameterValue {
        a_string(self)
    }
}

/// An optional string: empty (or blank) is `None`.
impl Param for Option<String> {
    fn read(name: &'static str, _: &Kind, v: ParameterValue) -> Result<Self, ParamError> {
        let v = string(name, v)?;
        Ok(if v.trim().is_empty() { None } else { Some(v) })
    }
    fn value(&self, _: &Kind) -> ParameterValue {
        a_string(self.as_deref().unwrap_or(""))
    }
}

impl Param for Option<PathBuf> {
    fn read(name: &'static str, kind: &Kind, v: ParameterValue) -> Result<Self, ParamError> {
        Ok(Option::<String>::read(name, kind, v)?.map(PathBuf::from))
    }
    fn value(&self, _: &Kind) -> ParameterValue {
        let text = self.as_ref().map(|p| p.display().to_string());
        a_string(&text.unwrap_or_default())
    }
}

/// A topic list: trimmed, empty names dropped, a name listed twice refused.
impl Param for Vec<String> {
    fn read(name: &'static str, _: &Kind, v: ParameterValue) -> Result<Self, ParamError> {
        let list = match v {
            ParameterValue::StringArray(v) => v,
            ParameterValue::String(s) => vec![s],
            v => return Err(bad(name, "a list of topic names", &v)),
        };
        let mut out: Vec<String> = Vec::new();
        for t in list
            .into_iter()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
        {
            if out.contains(&t) {
                return Err(ParamError {
                    name,
                    reason: format!("topic {t:?} is listed twice"),
                });
            }
            out.push(t);
        }
        Ok(out)
    }
    /// An empty list is `[""]`, because ROS YAML cannot hold an empty list and
    /// `ros2 param dump` must write a file the node accepts back.
    fn value(&self, _: &Kind) -> ParameterValue {
        if self.is_empty() {
            ParameterValue::StringArray(vec![String::new()])
        } else {
            ParameterValue::StringArray(self.clone())
        }
    }
}

/// Unsigned integer fields: the declared range must fit the type (`declared_ranges_are_enforced`
/// reads both ends of every range).
macro_rules! unsigned {
    ($($t:ty),*) => {$(
        impl Param for $t {
            fn read(
                name: &'static str,
                kind: &Kind,
                v: ParameterValue,
            ) -> Result<Self, ParamError> {
                let i = int(name, kind, v)?;
                let i = if matches!(kind, Kind::Mebibytes { .. }) { i << 20 } else { i };
                <$t>::try_from(i).map_err(|_| misdeclared(name, kind))
            }
            fn value(&self, kind: &Kind) -> ParameterValue {
                let i = i64::try_from(*self as u64).unwrap_or(i64::MAX);
                let mib = matches!(kind, Kind::Mebibytes { .. });
                ParameterValue::Integer(if mib { i >> 20 } else { i })
            }
        }
    )*};
}
unsigned!(u8, u32, usize);

/// A seed: `-1` (any negative the range allows) is `None`, a fresh seed per ask.
impl Param for Option<u64> {
    fn read(name: &'static str, kind: &Kind, v: ParameterValue) -> Result<Self, ParamError> {
        Ok(u64::try_from(int(name, kind, v)?).ok())
    }
    fn value(&self, _: &Kind) -> ParameterValue {
        ParameterValue::Integer(self.and_then(|x| i64::try_from(x).ok()).unwrap_or(-1))
    }
}

impl Param for f64 {
    fn read(name: &'static str, kind: &Kind, v: ParameterValue) -> Result<Self, ParamError> {
        match kind {
            Kind::Real(span) => double(name, span, v),
            Kind::Seconds(span) => {
                let x = double(name, span, v)?;
                time_limit(x).map_err(|e| ParamError {
                    name,
                    reason: e.to_string(),
                })?;
                Ok(x)
            }
            _ => Err(misdeclared(name, kind)),
        }
    }
    fn value(&self, _: &Kind) -> ParameterValue {
        ParameterValue::Double(*self)
    }
}

/// A double the sampler holds as an `f32`: checked again after the cast, since a finite
/// f64 can round to an infinite (1e39) or zero (1e-46) f32 that the range never saw.
impl Param for f32 {
    fn read(name: &'static str, kind: &Kind, v: ParameterValue) -> Result<Self, ParamError> {
        let Kind::Real(span) = kind else {
            return Err(misdeclared(name, kind));
        };
        let x = double(name, span, v)?;
        let f = x as f32;
        if f.is_finite() && span.contains(f64::from(f)) {
            Ok(f)
        } else {
            Err(ParamError {
                name,
                reason: format!("{x} is {f} as a 32-bit float, which is not {}", span.want()),
            })
        }
    }
    /// The double its decimal spelling is (0.7, not 0.699999988079071), so `ros2 param get`
    /// and `dump` show the value as it was written.
    fn value(&self, _: &Kind) -> ParameterValue {
        ParameterValue::Double(self.to_string().parse().unwrap_or(f64::from(*self)))
    }
}

/// `bpu_timeout_s`: any finite number reaches `vlm_bpu::timeout_from_secs`, whose message
/// names hbUCP's limit.
impl Param for Duration {
    fn read(name: &'static str, _: &Kind, v: ParameterValue) -> Result<Self, ParamError> {
        let x = number(name, v)?;
        if !x.is_finite() {
            return Err(ParamError {
                name,
                reason: format!("{x} is not a finite number"),
            });
        }
        vlm_bpu::timeout_from_secs(x).map_err(|reason| ParamError { name, reason })
    }
    fn value(&self, _: &Kind) -> ParameterValue {
        ParameterValue::Double(self.as_secs_f64())
    }
}

/// A [`Kind::Choice`] read by name: the error lists the declared names.
fn choice<T: Copy>(
    name: &'static str,
    kind: &Kind,
    v: ParameterValue,
    table: &[(&str, T)],
) -> Result<T, ParamError> {
    let Kind::Choice(names) = kind else {
        return Err(misdeclared(name, kind));
    };
    let got = string(name, v)?;
    table
        .iter()
        .find(|(n, _)| *n == got)
        .map(|(_, t)| *t)
        .ok_or_else(|| ParamError {
            name,
            reason: format!("{got:?} is not one of {}", names.join(", ")),
        })
}

/// `""` is `auto` too.
impl Param for BackendChoice {
    fn read(name: &'static str, kind: &Kind, v: ParameterValue) -> Result<Self, ParamError> {
        use BackendChoice::{Auto, Cpu};
        choice(name, kind, v, &[("auto", Auto), ("", Auto), ("cpu", Cpu)])
    }
    fn value(&self, _: &Kind) -> ParameterValue {
        a_string(match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Cpu => "cpu",
        })
    }
}

impl Param for CameraQos {
    fn read(name: &'static str, kind: &Kind, v: ParameterValue) -> Result<Self, ParamError> {
        use CameraQos::{Reliable, SensorData};
        choice(
            name,
            kind,
            v,
            &[("sensor_data", SensorData), ("reliable", Reliable)],
        )
    }
    fn value(&self, _: &Kind) -> ParameterValue {
        a_string(match self {
            CameraQos::SensorData => "sensor_data",
            CameraQos::Reliable => "reliable",
        })
    }
}

/// A log level by its ROS name (`fatal` is not one: tracing has no level above ERROR).
impl Param for tracing::Level {
    fn read(name: &'static str, kind: &Kind, v: ParameterValue) -> Result<Self, ParamError> {
        use tracing::Level;
        let table = [
            ("debug", Level::DEBUG),
            ("info", Level::INFO),
            ("warn", Level::WARN),
            ("error", Level::ERROR),
        ];
        choice(name, kind, v, &table)
    }
    fn value(&self, _: &Kind) -> ParameterValue {
        a_string(match *self {
            tracing::Level::TRACE | tracing::Level::DEBUG => "debug",
            tracing::Level::INFO => "info",
            tracing::Level::WARN => "warn",
            tracing::Level::ERROR => "error",
        })
    }
}

/// The BPU options parse themselves (their messages name their values).
macro_rules! parsed {
    ($($t:ty),*) => {$(
        impl Param for $t {
            fn read(name: &'static str, _: &Kind, v: ParameterValue) -> Result<Self, ParamError> {
                string(name, v)?.parse().map_err(|reason| ParamError { name, reason })
            }
            fn value(&self, _: &Kind) -> ParameterValue {
                a_string(self.as_str())
            }
        }
    )*};
}
parsed!(
    vlm_bpu::PrefillTail,
    vlm_bpu::PoolCheck,
    vlm_bpu::FlushOption
);
