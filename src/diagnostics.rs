//! `/diagnostics` (diagnostic_msgs/DiagnosticArray) at the configured period: model, backend,
//! state, queue depth, requests served/failed, last TTFT and tok/s, sessions, decode-state
//! snapshots taken, simulator counters. Also warns (log and so `/rosout`) when a camera topic
//! has publishers but no frame has arrived for a while, naming the usual causes. The level,
//! message and hardware id are judged in [`crate::health`]; every string is made safe for r2r
//! ([`crate::ros::text`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use camera_frame::CameraCache;
use r2r::diagnostic_msgs::msg::{DiagnosticArray, DiagnosticStatus, KeyValue};
use r2r::std_msgs::msg::Header;
use r2r::Publisher;

use crate::health::{self, NulWatch, Observed};
use crate::process::fatal;
use crate::process::test_hooks::{self, Site};
use crate::request::watch::board::WatchBoard;
use crate::ros::clock::RosClock;
use crate::ros::lifecycle::Lifecycle;
use crate::ros::param_server::LiveParams;
use crate::ros::params::time_limit;
use crate::ros::spin::NodeOps;
use crate::ros::text::{ros_text_uncounted, NulCount};
use crate::serve::priming::PrimingStats;
use crate::serve::registry::Registry;
use crate::serve::stats::SharedStats;

pub(crate) const TOPIC: &str = "/diagnostics";

/// Name of the status entry after the node's full name (an interface name: monitors match
/// it). `/diagnostics` is global by convention, so the full name tells two robots apart.
pub(crate) const STATUS_SUFFIX: &str = ": engine";

/// The status entry's name for the node `full_name`, e.g. `/robot1/vlm_node: engine`.
pub(crate) fn status_name(full_name: &str) -> String {
    format!("{full_name}{STATUS_SUFFIX}")
}

/// A camera topic silent this long (with publishers) is warned about.
pub(crate) const SILENT_CAMERA: Duration = Duration::from_secs(3);

/// How often one silent topic is warned about again.
const SILENT_REPEAT: Duration = Duration::from_secs(30);

/// What a status is made of; cloned for the node's last word after a runtime failure.
#[derive(Clone)]
pub(crate) struct Diagnostics {
    /// The status entry's name ([`status_name`]).
    pub(crate) name: String,
    /// The board the node runs on ([`health::board`]), for the hardware id.
    pub(crate) board: String,
    pub(crate) clock: RosClock,
    /// The node's count of replaced NULs.
    pub(crate) nuls: NulCount,
    pub(crate) publisher: Publisher<DiagnosticArray>,
    pub stats: SharedStats,
    pub registry: Arc<Registry>,
    pub cameras: Option<Arc<CameraCache>>,
    pub ops: NodeOps,
    /// `queue_depth`: a registry holding this many requests is saturated.
    pub queue_depth: usize,
    /// The parameters in force: the default camera's latest frame older than
    /// `max_image_age_s` (0 = no limit; settable at run time) is stale.
    pub params: LiveParams,
    /// The node's lifecycle state (`lifecycle_state`).
    pub lifecycle: Lifecycle,
    /// The watch goals' counters.
    pub(crate) watches: Arc<WatchBoard>,
}

/// The frame priming's counters: primings done and stopped, asks on its camera and
/// those served from it (hit rate), the primed frame's age now and at the last hit, the
/// share of wall time the BPU spent priming, and with `scene_check` the primings a scene
/// change started and the asks that found the primed scene still there or changed.
fn prefill_values(p: &PrimingStats, now: Instant) -> Vec<KeyValue> {
    let rate = if p.camera_asks == 0 {
        0.0
    } else {
        p.hits as f64 / p.camera_asks as f64
    };
    let age = p
        .frame_arrival
        .map_or(-1.0, |a| now.saturating_duration_since(a).as_secs_f64());
    vec![
        kv("prefills_done", p.done),
        kv("prefills_stopped", p.stopped),
        kv("prefill_camera_asks", p.camera_asks),
        kv("prefill_hits", p.hits),
        kv("prefill_hit_rate", format!("{rate:.3}")),
        kv("prefill_frame_age_s", format!("{age:.3}")),
        kv("prefill_last_hit_age_s", format!("{:.3}", p.last_hit_age_s)),
        kv("prefill_bpu_duty", format!("{:.3}", p.duty)),
        kv("prefills_on_scene_change", p.change_prefills),
        kv("prefill_scene_same_asks", p.scene_same_asks),
        kv("prefill_scene_changed_asks", p.scene_changed_asks),
    ]
}

/// The watch goals running, their evaluations (and those stopped for an ask or a detect,
/// made again later) and their events.
fn watch_values(watches: &WatchBoard) -> [KeyValue; 4] {
    let w = watches.counts();
    [
        kv("watches_active", w.active),
        kv("watch_evaluations", w.evaluations),
        kv("watch_evaluations_yielded", w.yielded),
        kv("watch_events", w.events),
    ]
}

fn kv(key: &str, value: impl ToString) -> KeyValue {
    KeyValue {
        key: ros_text_uncounted(key),
        value: ros_text_uncounted(value.to_string()),
    }
}

/// The status entry for the current counters; `nuls` remembers when NULs were last replaced.
pub(crate) fn status(d: &Diagnostics, nuls: &mut NulWatch) -> DiagnosticStatus {
    let s = d
        .stats
        .lock()
        .map(|g| g.clone())
        .unwrap_or_else(|e| e.into_inner().clone());
    let now = Instant::now();
    let nul_total = d.nuls.total();
    let queued = d.registry.len();
    let max_image_age = time_limit(d.params.snapshot().max_image_age_s)
        .ok()
        .flatten();
    let (level, message) = health::assess(&Observed {
        state: &s.state,
        fatal: fatal::reason(),
        queued,
        queue_depth: d.queue_depth,
        silent: d
            .cameras
            .as_ref()
            .map_or_else(Vec::new, |c| c.silent_topics(now, SILENT_CAMERA)),
        stale_default: d
            .cameras
            .as_ref()
            .and_then(|c| stale_default(c, max_image_age, now)),
        recent_nuls: nuls.observe(nul_total, now),
    });
    let mut values = vec![
        kv("state", s.state.as_str()),
        kv("lifecycle_state", d.lifecycle.state().label()),
        // BPU memory the process holds (board or simulator); none on the CPU backend.
        kv("device_memory_bytes", vlm_bpu::device_bytes_held()),
        kv("model", s.model.as_ref().map_or("", |m| m.name.as_str())),
        kv(
            "backend",
            s.model.as_ref().map_or("", |m| m.backend.as_str()),
        ),
        kv(
            "model_dir",
            s.model
                .as_ref()
                .map_or(String::new(), |m| m.dir.display().to_string()),
        ),
        kv("context", s.model.as_ref().map_or(0, |m| m.context)),
        kv("queue_depth", queued),
        kv("queue_capacity", d.queue_depth),
        kv("requests_served", s.served),
        kv("requests_failed", s.failed),
        kv("internal_errors", s.internal_errors),
        kv("nul_replaced", nul_total),
        kv("last_ttft_s", format!("{:.4}", s.last_ttft_s)),
        kv(
            "last_decode_tokens_per_s",
            format!("{:.2}", s.last_tokens_per_s),
        ),
        kv("sessions", s.sessions),
        kv("session_bytes", s.session_bytes),
        kv("sessions_evicted", s.sessions_evicted),
        kv("sessions_expired", s.sessions_expired),
        kv("state_snapshots", s.snapshots),
        kv("images_encoded", s.images_encoded),
    ];
    values.extend(watch_values(&d.watches));
    if let Some(p) = &s.prefill {
        values.extend(prefill_values(p, now));
    }
    if let Some(live) = s.sim_live {
        values.push(kv("sim_live_buffers", live.buffers));
        values.push(kv("sim_live_tasks", live.tasks));
    }
    if let Some(c) = &d.cameras {
        for t in c.topics() {
            if let Some(st) = c.stats(t) {
                values.push(kv(&format!("camera {t} accepted"), st.accepted));
                values.push(kv(&format!("camera {t} rejected"), st.rejected));
                values.push(kv(&format!("camera {t} scene_changes"), st.scene_changes));
                values.push(kv(
                    &format!("camera {t} frame_rate_hz"),
                    format!("{:.1}", st.frame_rate_hz()),
                ));
                // -1: no valid frame yet.
                values.push(kv(
                    &format!("camera {t} newest_frame_age_s"),
                    st.newest_frame_age(now)
                        .map_or_else(|| "-1".to_owned(), |a| format!("{:.2}", a.as_secs_f64())),
                ));
            }
        }
    }
    DiagnosticStatus {
        level,
        name: ros_text_uncounted(d.name.as_str()),
        message: ros_text_uncounted(message),
        hardware_id: ros_text_uncounted(health::hardware_id(s.model.as_ref(), &d.board)),
        values,
    }
}

/// The default camera, its latest frame's age and the limit, when that frame is too old for
/// an ask that names no camera.
fn stale_default(
    c: &CameraCache,
    max_age: Option<Duration>,
    now: Instant,
) -> Option<(Arc<str>, Duration, Duration)> {
    let max_age = max_age?;
    let topic = c.default_camera()?;
    let age = c.latest(topic)?.age(now);
    (age > max_age).then(|| (Arc::from(topic), age, max_age))
}

/// Publishes the current status once.
pub(crate) fn publish(d: &Diagnostics, nuls: &mut NulWatch) {
    let msg = DiagnosticArray {
        header: Header {
            stamp: d.clock.now(),
            frame_id: String::new(),
        },
        status: vec![status(d, nuls)],
    };
    if let Err(e) = d.publisher.publish(&msg) {
        tracing::debug!(error = %e, "could not publish diagnostics");
    }
}

/// Publishes until the task is aborted.
pub(crate) async fn run(d: Diagnostics, period: Duration) {
    let mut tick = tokio::time::interval(period);
    let mut watch = SilentWatch::default();
    let mut nuls = NulWatch::default();
    loop {
        tick.tick().await;
        test_hooks::point(Site::Diagnostics);
        publish(&d, &mut nuls);
        if let Some(c) = &d.cameras {
            silent_cameras(&d.ops, c, &mut watch).await;
        }
    }
}

/// Per-topic state of the silent-camera warning.
#[derive(Default)]
struct SilentWatch {
    /// When publishers were first seen on a still silent topic.
    publishers_since: HashMap<Arc<str>, Instant>,
    /// When the topic was last warned about.
    warned: HashMap<Arc<str>, Instant>,
}

async fn silent_cameras(ops: &NodeOps, c: &CameraCache, watch: &mut SilentWatch) {
    let now = Instant::now();
    let silent_now = c.silent_topics(now, SILENT_CAMERA);
    watch
        .publishers_since
        .retain(|t, _| silent_now.iter().any(|(s, _)| s == t));
    for (topic, silent) in silent_now {
        if watch
            .warned
            .get(&topic)
            .is_some_and(|t| now.duration_since(*t) < SILENT_REPEAT)
        {
            continue;
        }
        let t = topic.to_string();
        let publishers = ops
            .call(move |n| n.get_publishers_info_by_topic(&t, false).map(|v| v.len()))
            .await
            .and_then(Result::ok)
            .unwrap_or(0);
        if publishers == 0 {
            watch.publishers_since.remove(&topic);
            continue;
        }
        // A publisher that just appeared has not had time to deliver a frame yet.
        let since = *watch.publishers_since.entry(topic.clone()).or_insert(now);
        if now.duration_since(since) < SILENT_CAMERA {
            continue;
        }
        watch.warned.insert(topic.clone(), now);
        let text = format!(
            "camera topic {topic} has {publishers} publisher(s) but no frame arrived for {:.0} s. \
             Usual causes: (1) with Fast DDS on one host, frames above the default 512 KiB \
             shared-memory segment are lost on a best-effort subscription unless the camera \
             process uses a bigger segment (start it with \
             FASTRTPS_DEFAULT_PROFILES_FILE=<share/bpu_vlm>/launch/fastdds_large_frames.xml) or \
             camera_qos is reliable; (2) a QoS mismatch (a best-effort publisher never reaches a \
             reliable subscriber: keep camera_qos sensor_data); (3) a different ROS_DOMAIN_ID \
             or message type.",
            silent.as_secs_f64()
        );
        tracing::warn!("{text}");
    }
}
