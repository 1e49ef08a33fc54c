//! Latest valid frame per camera topic, and the choice of frame for an ask.
//!
//! Pure logic with no ROS: the node's per-topic tasks call [`CameraCache::record`] for each
//! message, its ask handler calls [`CameraCache::select`]. Times are passed in (`now`) so
//! the rules are testable; the node passes `Instant::now()`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::error::{FrameError, FrameErrorKind};
use crate::frame::Frame;
use crate::scene::SceneSignature;

/// A message header stamp (`builtin_interfaces/Time`), kept as the camera sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp {
    pub sec: i32,
    pub nanosec: u32,
}

/// The parts of a message header (`std_msgs/Header`) an answer reports about its image.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FrameHeader {
    pub stamp: Stamp,
    /// The sensor's TF frame, as the camera sent it (possibly empty).
    pub frame_id: Arc<str>,
}

impl From<Stamp> for FrameHeader {
    /// A header with no TF frame.
    fn from(stamp: Stamp) -> Self {
        Self {
            stamp,
            frame_id: Arc::from(""),
        }
    }
}

/// The frame chosen for an ask, with where and when it came from.
#[derive(Debug, Clone)]
pub struct CachedFrame {
    pub topic: Arc<str>,
    pub frame: Arc<Frame>,
    /// The header stamp (possibly a sensor clock unrelated to this host's).
    pub stamp: Stamp,
    /// The header's TF frame, so an answer can be tied to the camera.
    pub frame_id: Arc<str>,
    /// When the node received it (host monotonic clock); ages are measured from here.
    pub arrival: Instant,
    /// 1 for the first frame accepted on the topic, then counting up.
    pub seq: u64,
    /// The frame's scene signature, computed once on arrival; `None` for a jpeg/png body
    /// not decoded yet.
    pub scene: Option<Arc<SceneSignature>>,
}

impl CachedFrame {
    /// Time since arrival.
    pub fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.arrival)
    }

    /// Whether `newer` shows the same scene as this frame under `threshold` (a
    /// [`SceneSignature::change`] score): the same frame always does; a frame without a
    /// signature, of another camera or of another size never does.
    pub fn same_scene(&self, newer: &CachedFrame, threshold: f64) -> bool {
        if self.topic == newer.topic && self.seq == newer.seq {
            return true;
        }
        match (&self.scene, &newer.scene) {
            (Some(a), Some(b)) if self.topic == newer.topic => a.same_scene(b, threshold),
            _ => false,
        }
    }
}

/// Cache set-up, from the node's parameters.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Every subscribed camera topic, raw and compressed (fully resolved names).
    pub topics: Vec<String>,
    /// The camera an ask without one uses; `None` or empty means the first topic.
    pub default_camera: Option<String>,
    /// Minimum time between two rejection warnings for one topic.
    pub warn_interval: Duration,
}

/// A cache configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheConfigError {
    #[error("camera topic list contains an empty name")]
    EmptyTopic,
    #[error("camera topic {topic:?} is listed twice")]
    DuplicateTopic { topic: String },
    #[error("default_camera {name:?} is not one of the camera topics")]
    UnknownDefault { name: String },
    #[error("camera name {alias:?} stands for {topic:?}, which is not one of the camera topics")]
    UnknownAliasTarget { alias: String, topic: String },
}

/// Why no frame could be picked for an ask.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// The ask named a camera that is not subscribed.
    #[error("unknown camera {name:?}")]
    UnknownCamera { name: String },
    /// The ask wants the default camera but no camera topic is configured.
    #[error("no camera topic is configured")]
    NoCamera,
    /// The camera is subscribed but no valid frame has arrived yet.
    #[error("no image has arrived on {topic}")]
    NoImage { topic: String },
    /// The latest valid frame is older than the allowed age.
    #[error("latest image on {topic} is {age:?} old, above the limit of {max_age:?}")]
    StaleImage {
        topic: String,
        age: Duration,
        max_age: Duration,
    },
    /// No valid frame arrived on the camera for longer than the allowed silence: the camera
    /// has stopped, whatever frame an answer would use.
    #[error(
        "camera {topic} silent for {:.1} s (no valid frame; the limit is {:.1} s)",
        silent.as_secs_f64(),
        max_silence.as_secs_f64()
    )]
    SilentCamera {
        topic: String,
        silent: Duration,
        max_silence: Duration,
    },
}

/// How recent an ask needs its camera to be (`None`: no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Freshness {
    /// The latest valid frame at most this old.
    pub max_age: Option<Duration>,
    /// A valid frame arrived at most this long ago (the camera is alive).
    pub max_silence: Option<Duration>,
}

/// `record` was called for a topic the cache was not configured with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("topic {topic:?} is not a configured camera topic")]
pub struct UnknownTopic {
    pub topic: String,
}

/// A rejection the node should log now (at most one per topic per `warn_interval`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectWarning {
    pub topic: String,
    pub error: FrameError,
    /// Rejections on this topic that were not warned about since the previous warning.
    pub suppressed: u64,
    /// All rejections on this topic so far, this one included.
    pub rejected_total: u64,
}

/// Counters for one topic, for diagnostics and the "publishers but no frames" warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicStats {
    pub accepted: u64,
    pub rejected: u64,
    /// When the cache was created (the subscription's start).
    pub registered_at: Instant,
    /// Last message of any kind, valid or rejected.
    pub last_arrival: Option<Instant>,
    /// Last valid frame.
    pub last_accepted: Option<Instant>,
    pub last_rejection: Option<FrameErrorKind>,
    /// Smoothed time between valid frames (exponential average, weight 1/8 for the newest
    /// interval); `None` before the second valid frame.
    pub frame_interval: Option<Duration>,
    /// Scene changes seen: valid frames whose scene differs from the one the topic's scene
    /// began with (the first frame counts as none).
    pub scene_changes: u64,
    /// Arrival of the first frame of the current scene (`None` before a frame with a
    /// signature): the scene has held since then.
    pub scene_since: Option<Instant>,
}

impl TopicStats {
    /// Time without any message on the topic: since the last arrival, or since registration
    /// when nothing ever arrived. The node warns when this is long while the topic has
    /// publishers (too-large frames lost in DDS shared memory, QoS mismatch).
    pub fn silent_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_arrival.unwrap_or(self.registered_at))
    }

    /// Valid frames per second, from the smoothed interval (0 before two frames).
    pub fn frame_rate_hz(&self) -> f64 {
        self.frame_interval.map_or(0.0, |d| {
            if d.is_zero() {
                0.0
            } else {
                1.0 / d.as_secs_f64()
            }
        })
    }

    /// Time since the newest valid frame arrived (`None`: none yet).
    pub fn newest_frame_age(&self, now: Instant) -> Option<Duration> {
        self.last_accepted.map(|t| now.saturating_duration_since(t))
    }
}

#[derive(Debug)]
struct Slot {
    latest: Option<CachedFrame>,
    stats: TopicStats,
    last_warning: Option<Instant>,
    suppressed: u64,
    /// The signature the current scene began with.
    scene_start: Option<Arc<SceneSignature>>,
}

/// Latest valid frame per camera topic. Shareable across threads (`Arc<CameraCache>`); each
/// topic has its own lock, held only to swap or clone an `Arc`.
#[derive(Debug)]
pub struct CameraCache {
    order: Vec<Arc<str>>,
    slots: HashMap<Arc<str>, Mutex<Slot>>,
    /// Other names of configured topics (a relative name as configured → the resolved one).
    aliases: HashMap<String, Arc<str>>,
    default_camera: Option<Arc<str>>,
    warn_interval: Duration,
    /// Change score above which a frame starts a new scene ([`TopicStats::scene_changes`]).
    scene_threshold: f64,
}

impl CameraCache {
    /// Creates the cache for a fixed set of topics; `now` starts each topic's silence clock.
    pub fn new(config: CacheConfig, now: Instant) -> Result<Self, CacheConfigError> {
        let mut order = Vec::with_capacity(config.topics.len());
        let mut slots = HashMap::with_capacity(config.topics.len());
        for topic in config.topics {
            if topic.is_empty() {
                return Err(CacheConfigError::EmptyTopic);
            }
            let key: Arc<str> = topic.into();
            let slot = Slot {
                latest: None,
                stats: TopicStats {
                    accepted: 0,
                    rejected: 0,
                    registered_at: now,
                    last_arrival: None,
                    last_accepted: None,
                    last_rejection: None,
                    frame_interval: None,
                    scene_changes: 0,
                    scene_since: None,
                },
                last_warning: None,
                suppressed: 0,
                scene_start: None,
            };
            if slots.insert(key.clone(), Mutex::new(slot)).is_some() {
                return Err(CacheConfigError::DuplicateTopic {
                    topic: key.to_string(),
                });
            }
            order.push(key);
        }
        let mut cache = Self {
            order,
            slots,
            aliases: HashMap::new(),
            default_camera: None,
            warn_interval: config.warn_interval,
            scene_threshold: crate::scene::DEFAULT_SCENE_CHANGE_THRESHOLD,
        };
        cache.default_camera = match config.default_camera.filter(|s| !s.is_empty()) {
            Some(name) => Some(
                cache
                    .resolve(&name)
                    .ok_or(CacheConfigError::UnknownDefault { name })?,
            ),
            None => cache.order.first().cloned(),
        };
        Ok(cache)
    }

    /// Lets each `(alias, topic)` name a configured topic too, as a request may name a camera
    /// by its configured (relative) name while the cache lists it by its resolved name.
    pub fn with_aliases(
        mut self,
        aliases: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, CacheConfigError> {
        for (alias, topic) in aliases {
            let Some((key, _)) = self.slots.get_key_value(topic.as_str()) else {
                return Err(CacheConfigError::UnknownAliasTarget { alias, topic });
            };
            self.aliases.insert(alias, key.clone());
        }
        Ok(self)
    }

    /// Sets the change score above which a frame starts a new scene (default
    /// [`crate::DEFAULT_SCENE_CHANGE_THRESHOLD`]).
    pub fn with_scene_threshold(mut self, threshold: f64) -> Self {
        self.scene_threshold = threshold;
        self
    }

    /// The change score above which two frames show different scenes.
    pub fn scene_threshold(&self) -> f64 {
        self.scene_threshold
    }

    /// The configured topics, in configuration order.
    pub fn topics(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(|t| &**t)
    }

    /// The topic an ask without a camera uses.
    pub fn default_camera(&self) -> Option<&str> {
        self.default_camera.as_deref()
    }

    /// The configured topic a camera name refers to: the exact name, an alias, or the name
    /// with a leading `/` added (`image_raw` → `/image_raw`).
    pub fn resolve(&self, name: &str) -> Option<Arc<str>> {
        if let Some((k, _)) = self.slots.get_key_value(name) {
            return Some(k.clone());
        }
        if let Some(k) = self.aliases.get(name) {
            return Some(k.clone());
        }
        if name.starts_with('/') {
            return None;
        }
        self.slots
            .get_key_value(format!("/{name}").as_str())
            .map(|(k, _)| k.clone())
    }

    /// Records one message's outcome: a valid frame replaces the topic's latest one; a
    /// rejected frame keeps it, is counted, and returns a warning to log when the topic's
    /// rate limit allows.
    pub fn record(
        &self,
        topic: &str,
        outcome: Result<Frame, FrameError>,
        header: impl Into<FrameHeader>,
        now: Instant,
    ) -> Result<Option<RejectWarning>, UnknownTopic> {
        let header = header.into();
        // Outside the lock: the signature reads the frame (tens of µs at 640×480).
        let scene = outcome
            .as_ref()
            .ok()
            .and_then(SceneSignature::of_frame)
            .map(Arc::new);
        let (key, slot) = self
            .slots
            .get_key_value(topic)
            .ok_or_else(|| UnknownTopic {
                topic: topic.to_owned(),
            })?;
        let mut slot = lock(slot);
        slot.stats.last_arrival = Some(now);
        match outcome {
            Ok(frame) => {
                slot.stats.accepted += 1;
                if let Some(prev) = slot.stats.last_accepted {
                    let dt = now.saturating_duration_since(prev);
                    slot.stats.frame_interval = Some(match slot.stats.frame_interval {
                        Some(avg) => (avg * 7 + dt) / 8,
                        None => dt,
                    });
                }
                slot.stats.last_accepted = Some(now);
                self.follow_scene(&mut slot, scene.as_ref(), now);
                slot.latest = Some(CachedFrame {
                    topic: key.clone(),
                    frame: Arc::new(frame),
                    stamp: header.stamp,
                    frame_id: header.frame_id,
                    arrival: now,
                    seq: slot.stats.accepted,
                    scene,
                });
                Ok(None)
            }
            Err(error) => {
                slot.stats.rejected += 1;
                slot.stats.last_rejection = Some(error.kind());
                let due = slot
                    .last_warning
                    .is_none_or(|t| now.saturating_duration_since(t) >= self.warn_interval);
                if !due {
                    slot.suppressed += 1;
                    return Ok(None);
                }
                slot.last_warning = Some(now);
                let suppressed = std::mem::take(&mut slot.suppressed);
                Ok(Some(RejectWarning {
                    topic: key.to_string(),
                    error,
                    suppressed,
                    rejected_total: slot.stats.rejected,
                }))
            }
        }
    }

    /// Counts a scene change when `scene` differs from the one the topic's scene began with
    /// (a frame without a signature ends the scene: nothing can be said of it).
    fn follow_scene(&self, slot: &mut Slot, scene: Option<&Arc<SceneSignature>>, now: Instant) {
        let same = match (&slot.scene_start, scene) {
            (Some(a), Some(b)) => a.same_scene(b, self.scene_threshold),
            _ => false,
        };
        if same {
            return;
        }
        if slot.scene_start.is_some() {
            slot.stats.scene_changes += 1;
        }
        slot.scene_start = scene.cloned();
        slot.stats.scene_since = scene.map(|_| now);
    }

    /// Picks the frame for an ask: the named camera (see [`CameraCache::resolve`]) or the
    /// default one; its latest valid frame must exist, have arrived at most
    /// `fresh.max_silence` before `now` (the camera is alive) and be at most `fresh.max_age`
    /// old (each when set).
    pub fn select(
        &self,
        camera: Option<&str>,
        fresh: Freshness,
        now: Instant,
    ) -> Result<CachedFrame, SelectError> {
        let topic = match camera {
            Some(name) => self
                .resolve(name)
                .ok_or_else(|| SelectError::UnknownCamera {
                    name: name.to_owned(),
                })?,
            None => self.default_camera.clone().ok_or(SelectError::NoCamera)?,
        };
        let latest = self.latest(&topic).ok_or_else(|| SelectError::NoImage {
            topic: topic.to_string(),
        })?;
        let age = latest.age(now);
        if let Some(max_silence) = fresh.max_silence.filter(|m| age > *m) {
            return Err(SelectError::SilentCamera {
                topic: topic.to_string(),
                silent: age,
                max_silence,
            });
        }
        if let Some(max_age) = fresh.max_age {
            if age > max_age {
                return Err(SelectError::StaleImage {
                    topic: topic.to_string(),
                    age,
                    max_age,
                });
            }
        }
        Ok(latest)
    }

    /// The latest valid frame on a configured topic (exact name).
    pub fn latest(&self, topic: &str) -> Option<CachedFrame> {
        self.slots.get(topic).and_then(|s| lock(s).latest.clone())
    }

    /// Counters for a configured topic (exact name).
    pub fn stats(&self, topic: &str) -> Option<TopicStats> {
        self.slots.get(topic).map(|s| lock(s).stats.clone())
    }

    /// Topics with no message for at least `threshold` at `now`, with how long; the node
    /// warns about those that have publishers.
    pub fn silent_topics(&self, now: Instant, threshold: Duration) -> Vec<(Arc<str>, Duration)> {
        self.order
            .iter()
            .filter_map(|t| {
                let silent = lock(&self.slots[t]).stats.silent_for(now);
                (silent >= threshold).then(|| (t.clone(), silent))
            })
            .collect()
    }
}

/// A panic while holding a slot lock leaves plain assigned fields, still consistent.
fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::{ImageMsg, Limits};

    fn age(max_age: Duration) -> Freshness {
        Freshness {
            max_age: Some(max_age),
            max_silence: None,
        }
    }

    fn frame(value: u8) -> Frame {
        Frame::from_image(
            ImageMsg {
                encoding: "mono8",
                width: 2,
                height: 1,
                step: 2,
                is_bigendian: false,
                data: vec![value, value],
            },
            &Limits::default(),
        )
        .unwrap()
    }

    fn bad() -> FrameError {
        FrameError::UnknownEncoding {
            encoding: "bayer".into(),
        }
    }

    fn cache(t0: Instant) -> CameraCache {
        CameraCache::new(
            CacheConfig {
                topics: vec!["/image_raw".into(), "/image_raw/compressed".into()],
                default_camera: None,
                warn_interval: Duration::from_secs(10),
            },
            t0,
        )
        .unwrap()
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn keeps_latest_valid_frame_and_rejects_keep_previous() {
        let t0 = Instant::now();
        let c = cache(t0);
        let st = Stamp { sec: 5, nanosec: 7 };
        assert_eq!(
            c.record("/image_raw", Ok(frame(1)), st, t0 + S(1)),
            Ok(None)
        );
        assert_eq!(
            c.record("/image_raw", Ok(frame(2)), Stamp::default(), t0 + S(2)),
            Ok(None)
        );
        let w = c
            .record("/image_raw", Err(bad()), Stamp::default(), t0 + S(3))
            .unwrap()
            .expect("first rejection warns");
        assert_eq!((w.suppressed, w.rejected_total), (0, 1));
        let got = c.select(None, Freshness::default(), t0 + S(4)).unwrap();
        assert_eq!(got.frame.data(), &[2, 2]);
        assert_eq!(
            (got.seq, got.arrival, &*got.topic),
            (2, t0 + S(2), "/image_raw")
        );
        let stats = c.stats("/image_raw").unwrap();
        assert_eq!((stats.accepted, stats.rejected), (2, 1));
        assert_eq!(stats.last_rejection, Some(FrameErrorKind::UnknownEncoding));
        assert_eq!(stats.last_arrival, Some(t0 + S(3)));
        assert_eq!(stats.last_accepted, Some(t0 + S(2)));
        assert!(c
            .record("/other", Ok(frame(0)), Stamp::default(), t0)
            .is_err());
    }

    #[test]
    fn latest_frame_keeps_its_own_header_and_a_rejection_keeps_the_previous_one() {
        let t0 = Instant::now();
        let c = cache(t0);
        let header = |sec, id: &str| FrameHeader {
            stamp: Stamp { sec, nanosec: 3 },
            frame_id: Arc::from(id),
        };
        c.record("/image_raw", Ok(frame(1)), header(11, "cam_left"), t0)
            .unwrap();
        c.record("/image_raw", Err(bad()), header(12, "other"), t0 + S(1))
            .unwrap();
        let got = c.select(None, Freshness::default(), t0 + S(1)).unwrap();
        assert_eq!(
            (got.stamp, &*got.frame_id),
            (
                Stamp {
                    sec: 11,
                    nanosec: 3
                },
                "cam_left"
            )
        );
        c.record(
            "/image_raw",
            Ok(frame(2)),
            header(13, "cam_right"),
            t0 + S(2),
        )
        .unwrap();
        let got = c.select(None, Freshness::default(), t0 + S(2)).unwrap();
        assert_eq!(
            (got.stamp.sec, &*got.frame_id, got.frame.data()),
            (13, "cam_right", &[2u8, 2][..])
        );
        // A bare stamp carries no TF frame.
        c.record("/image_raw", Ok(frame(3)), Stamp::default(), t0 + S(3))
            .unwrap();
        assert_eq!(&*c.latest("/image_raw").unwrap().frame_id, "");
    }

    #[test]
    fn aliases_name_resolved_topics() {
        let t0 = Instant::now();
        let c = CameraCache::new(
            CacheConfig {
                topics: vec!["/robot1/image_raw".into()],
                default_camera: None,
                warn_interval: S(1),
            },
            t0,
        )
        .unwrap()
        .with_aliases([("image_raw".to_owned(), "/robot1/image_raw".to_owned())])
        .unwrap();
        assert_eq!(c.resolve("image_raw").as_deref(), Some("/robot1/image_raw"));
        assert_eq!(
            c.resolve("/robot1/image_raw").as_deref(),
            Some("/robot1/image_raw")
        );
        assert_eq!(c.resolve("/image_raw"), None);
        c.record("/robot1/image_raw", Ok(frame(4)), Stamp::default(), t0)
            .unwrap();
        assert_eq!(
            &*c.select(Some("image_raw"), Freshness::default(), t0)
                .unwrap()
                .topic,
            "/robot1/image_raw"
        );
        let unknown = CameraCache::new(
            CacheConfig {
                topics: vec!["/a".into()],
                default_camera: None,
                warn_interval: S(1),
            },
            t0,
        )
        .unwrap()
        .with_aliases([("b".to_owned(), "/b".to_owned())]);
        assert!(unknown.is_err());
    }

    #[test]
    fn rejection_warnings_are_rate_limited() {
        let t0 = Instant::now();
        let c = cache(t0);
        let rec = |t| {
            c.record("/image_raw", Err(bad()), Stamp::default(), t)
                .unwrap()
        };
        assert!(rec(t0).is_some());
        assert!(rec(t0 + S(1)).is_none());
        assert!(rec(t0 + S(9)).is_none());
        let w = rec(t0 + S(10)).expect("interval passed");
        assert_eq!((w.suppressed, w.rejected_total), (2, 4));
        assert!(rec(t0 + S(11)).is_none());
        // Topics are limited independently.
        assert!(c
            .record(
                "/image_raw/compressed",
                Err(bad()),
                Stamp::default(),
                t0 + S(11)
            )
            .unwrap()
            .is_some());
    }

    #[test]
    fn selection_errors() {
        let t0 = Instant::now();
        let c = cache(t0);
        let e = c
            .select(Some("/nope"), Freshness::default(), t0)
            .unwrap_err();
        assert_eq!(
            e,
            SelectError::UnknownCamera {
                name: "/nope".into()
            }
        );
        let e = c.select(None, Freshness::default(), t0).unwrap_err();
        assert_eq!(
            e,
            SelectError::NoImage {
                topic: "/image_raw".into()
            }
        );
        c.record("/image_raw/compressed", Ok(frame(9)), Stamp::default(), t0)
            .unwrap();
        // Relative name resolves to the absolute topic.
        let got = c
            .select(Some("image_raw/compressed"), age(S(2)), t0 + S(2))
            .unwrap();
        assert_eq!(got.frame.data(), &[9, 9]);
        let e = c
            .select(Some("/image_raw/compressed"), age(S(2)), t0 + S(3))
            .unwrap_err();
        assert_eq!(
            e,
            SelectError::StaleImage {
                topic: "/image_raw/compressed".into(),
                age: S(3),
                max_age: S(2)
            }
        );
        // No limit: any age.
        assert!(c
            .select(
                Some("/image_raw/compressed"),
                Freshness::default(),
                t0 + S(3600)
            )
            .is_ok());
        let empty = CameraCache::new(
            CacheConfig {
                topics: vec![],
                default_camera: None,
                warn_interval: S(1),
            },
            t0,
        )
        .unwrap();
        assert_eq!(
            empty.select(None, Freshness::default(), t0).unwrap_err(),
            SelectError::NoCamera
        );
    }

    #[test]
    fn config_checks_and_default_camera() {
        let t0 = Instant::now();
        let cfg = |topics: &[&str], default: Option<&str>| CacheConfig {
            topics: topics.iter().map(|s| s.to_string()).collect(),
            default_camera: default.map(str::to_owned),
            warn_interval: S(1),
        };
        let c = CameraCache::new(cfg(&["/a", "/b"], Some("b")), t0).unwrap();
        assert_eq!(c.default_camera(), Some("/b"));
        let c = CameraCache::new(cfg(&["/a", "/b"], Some("")), t0).unwrap();
        assert_eq!(c.default_camera(), Some("/a"));
        assert_eq!(
            CameraCache::new(cfg(&["/a", "/a"], None), t0).unwrap_err(),
            CacheConfigError::DuplicateTopic { topic: "/a".into() }
        );
        assert_eq!(
            CameraCache::new(cfg(&["/a"], Some("/c")), t0).unwrap_err(),
            CacheConfigError::UnknownDefault { name: "/c".into() }
        );
        assert_eq!(
            CameraCache::new(cfg(&[""], None), t0).unwrap_err(),
            CacheConfigError::EmptyTopic
        );
    }

    #[test]
    fn silence_detection() {
        let t0 = Instant::now();
        let c = cache(t0);
        c.record("/image_raw", Err(bad()), Stamp::default(), t0 + S(4))
            .unwrap();
        // Rejected frames count as arrivals: the camera is talking, just badly.
        let silent = c.silent_topics(t0 + S(5), S(3));
        assert_eq!(silent.len(), 1);
        assert_eq!(
            (&*silent[0].0, silent[0].1),
            ("/image_raw/compressed", S(5))
        );
        assert_eq!(c.stats("/image_raw").unwrap().silent_for(t0 + S(5)), S(1));
    }

    #[test]
    fn concurrent_writers_and_readers() {
        let t0 = Instant::now();
        let c = Arc::new(cache(t0));
        std::thread::scope(|s| {
            for (i, topic) in ["/image_raw", "/image_raw/compressed"]
                .into_iter()
                .enumerate()
            {
                let c = &c;
                s.spawn(move || {
                    for n in 0..500u32 {
                        let outcome = if n % 5 == 4 {
                            Err(bad())
                        } else {
                            Ok(frame(i as u8))
                        };
                        c.record(topic, outcome, Stamp::default(), t0).unwrap();
                    }
                });
            }
            let c = &c;
            s.spawn(move || {
                for _ in 0..500 {
                    if let Ok(f) = c.select(None, Freshness::default(), t0) {
                        assert_eq!(f.frame.data(), &[0, 0]);
                    }
                }
            });
        });
        for topic in ["/image_raw", "/image_raw/compressed"] {
            let st = c.stats(topic).unwrap();
            assert_eq!((st.accepted, st.rejected), (400, 100));
            assert_eq!(c.latest(topic).unwrap().seq, 400);
        }
    }

    /// A camera is silent once no valid frame arrived for `max_silence`: rejected frames do
    /// not count as arrivals, the limit applies whatever `max_age` says, and the frame rate
    /// follows the valid frames' intervals.
    #[test]
    fn a_silent_camera_is_refused_and_its_rate_is_measured() {
        let t0 = Instant::now();
        let c = cache(t0);
        let ms = Duration::from_millis;
        for i in 0..10u64 {
            c.record(
                "/image_raw",
                Ok(frame(1)),
                FrameHeader::default(),
                t0 + ms(100 * i),
            )
            .unwrap();
        }
        let st = c.stats("/image_raw").unwrap();
        assert!(
            (st.frame_rate_hz() - 10.0).abs() < 0.01,
            "{}",
            st.frame_rate_hz()
        );
        let last = t0 + ms(900);
        // Rejected messages keep arriving: not a sign of life.
        c.record(
            "/image_raw",
            Err(bad()),
            FrameHeader::default(),
            last + S(2),
        )
        .unwrap();
        let fresh = Freshness {
            max_age: None,
            max_silence: Some(S(2)),
        };
        assert!(c.select(None, fresh, last + S(2)).is_ok());
        let e = c.select(None, fresh, last + ms(2100)).unwrap_err();
        assert_eq!(
            e,
            SelectError::SilentCamera {
                topic: "/image_raw".into(),
                silent: ms(2100),
                max_silence: S(2),
            }
        );
        assert!(e.to_string().contains("silent for 2.1 s"), "{e}");
        let both = Freshness {
            max_age: Some(S(60)),
            ..fresh
        };
        assert!(c.select(None, both, last + S(3)).is_err());
        assert_eq!(
            st.newest_frame_age(last + S(1)),
            Some(S(1)),
            "from the newest valid frame"
        );
    }

    #[test]
    fn accepted_frames_carry_their_scene_signature() {
        let t0 = Instant::now();
        let c = cache(t0);
        c.record("/image_raw", Ok(frame(10)), Stamp::default(), t0)
            .unwrap();
        let first = c.latest("/image_raw").unwrap();
        assert!(first.scene.is_some(), "computed on arrival");
        c.record("/image_raw", Ok(frame(11)), Stamp::default(), t0 + S(1))
            .unwrap();
        let flicker = c.latest("/image_raw").unwrap();
        // A uniform step is a brightness change, not a new scene.
        assert!(first.same_scene(&flicker, 0.025));
        assert!(first.same_scene(&first, 0.0), "a frame is its own scene");
        let other = CachedFrame {
            topic: Arc::from("/image_raw/compressed"),
            ..flicker.clone()
        };
        assert!(!first.same_scene(&other, 1.0), "another camera never is");
        let unsigned = CachedFrame {
            scene: None,
            seq: 99,
            ..flicker
        };
        assert!(
            !first.same_scene(&unsigned, 1.0),
            "nor a frame without a signature"
        );
        let stats = c.stats("/image_raw").unwrap();
        assert_eq!((stats.scene_changes, stats.scene_since), (0, Some(t0)));
    }

    #[test]
    fn scene_changes_are_counted_against_the_scene_start() {
        let t0 = Instant::now();
        let c = cache(t0);
        let two = |a: u8, b: u8| {
            Frame::from_image(
                ImageMsg {
                    encoding: "mono8",
                    width: 2,
                    height: 1,
                    step: 2,
                    is_bigendian: false,
                    data: vec![a, b],
                },
                &Limits::default(),
            )
            .unwrap()
        };
        for (i, (a, b, changes, since)) in [
            (10, 200, 0, 0),
            (12, 202, 0, 0), // brightness only
            (200, 10, 1, 2), // new scene
            (201, 11, 1, 2),
            (10, 200, 2, 4), // and back
        ]
        .into_iter()
        .enumerate()
        {
            c.record(
                "/image_raw",
                Ok(two(a, b)),
                Stamp::default(),
                t0 + S(i as u64),
            )
            .unwrap();
            let st = c.stats("/image_raw").unwrap();
            assert_eq!(
                (st.scene_changes, st.scene_since),
                (changes, Some(t0 + S(since))),
                "frame {i}"
            );
        }
    }
}
