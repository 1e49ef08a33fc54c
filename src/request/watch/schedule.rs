//! When a watch evaluates (pure, so it is tested without a graph): once at the start, then
//! when the camera's scene differs from the one last evaluated and has held for
//! `scene_settle_s`, never two evaluations within `min_interval_s`, and with `max_interval_s`
//! also on an unchanged scene that often. The scene is judged by the camera cache's
//! signatures, so sensor noise and flicker start nothing, and a pre-fill completing or
//! being refreshed is no change: only the camera's frames are.

use std::time::{Duration, Instant};

use camera_frame::CachedFrame;

/// A goal's timing settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Timing {
    pub min_interval: Duration,
    /// `None`: only a changed scene is evaluated again.
    pub max_interval: Option<Duration>,
    /// How long a changed scene must hold (`scene_settle_s`).
    pub settle: Duration,
    /// Two signatures farther apart than this show different scenes.
    pub threshold: f64,
}

/// The last evaluation a decision is made against.
pub(crate) struct Last<'a> {
    /// When it started.
    pub started: Instant,
    /// The camera's newest frame when it started: the scene it judged.
    pub frame: &'a CachedFrame,
}

/// Whether to evaluate now, given the camera's `newest` frame and since when its scene has
/// held (`scene_since`, the camera cache's).
pub(crate) fn due(
    timing: &Timing,
    last: Option<Last<'_>>,
    newest: &CachedFrame,
    scene_since: Option<Instant>,
    now: Instant,
) -> bool {
    let Some(last) = last else {
        return true;
    };
    let since_last = now.saturating_duration_since(last.started);
    if since_last < timing.min_interval {
        return false;
    }
    if timing.max_interval.is_some_and(|m| since_last >= m) {
        return true;
    }
    if last.frame.same_scene(newest, timing.threshold) {
        return false;
    }
    // A frame without a signature (a compressed body not decoded yet) cannot be judged: it
    // counts as a change, made at most every `min_interval_s` (and settled since the last).
    let held = scene_since.map_or(since_last, |t| now.saturating_duration_since(t));
    held >= timing.settle
}

/// Whether the camera is silent: no frame, or none for longer than `max_silence` (`None`:
/// never silent while it has a frame).
pub(crate) fn silent(
    newest: Option<&CachedFrame>,
    max_silence: Option<Duration>,
    now: Instant,
) -> bool {
    match newest {
        None => true,
        Some(f) => max_silence.is_some_and(|m| f.age(now) > m),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use camera_frame::{Frame, ImageMsg, Limits, SceneSignature, Stamp};

    use super::*;

    /// A grey frame; `level` paints its top-left quarter (an object come into view).
    fn frame(level: u8, seq: u64, arrival: Instant) -> CachedFrame {
        let (w, h) = (64u32, 48u32);
        let data: Vec<u8> = (0..h)
            .flat_map(|y| (0..w).map(move |x| if x < w / 2 && y < h / 2 { level } else { 20 }))
            .collect();
        let msg = ImageMsg {
            encoding: "mono8",
            width: w,
            height: h,
            step: w,
            is_bigendian: false,
            data,
        };
        let frame = Frame::from_image(msg, &Limits::default()).unwrap();
        let scene = SceneSignature::of_frame(&frame).map(Arc::new);
        CachedFrame {
            topic: "/cam".into(),
            frame: Arc::new(frame),
            stamp: Stamp::default(),
            frame_id: "".into(),
            arrival,
            seq,
            scene,
        }
    }

    fn timing() -> Timing {
        Timing {
            min_interval: Duration::from_secs(1),
            max_interval: None,
            settle: Duration::from_millis(500),
            threshold: camera_frame::DEFAULT_SCENE_CHANGE_THRESHOLD,
        }
    }

    #[test]
    fn the_first_evaluation_is_at_once_then_only_on_a_settled_change() {
        let t0 = Instant::now();
        let s = |ms| t0 + Duration::from_millis(ms);
        let old = frame(20, 1, t0);
        assert!(due(&timing(), None, &old, Some(t0), t0));
        let last = || {
            Some(Last {
                started: t0,
                frame: &old,
            })
        };
        // The same scene: never, however long.
        let same = frame(20, 50, s(5000));
        assert!(!due(&timing(), last(), &same, Some(t0), s(60_000)));
        // A new scene: once it has held for the settle time, and not within min_interval.
        let new = frame(200, 60, s(600));
        assert!(
            !due(&timing(), last(), &new, Some(s(600)), s(900)),
            "too soon"
        );
        assert!(
            !due(&timing(), last(), &new, Some(s(600)), s(1050)),
            "not settled"
        );
        assert!(due(&timing(), last(), &new, Some(s(600)), s(1100)));
    }

    #[test]
    fn max_interval_evaluates_an_unchanged_scene_again() {
        let t0 = Instant::now();
        let f = frame(20, 1, t0);
        let timing = Timing {
            max_interval: Some(Duration::from_secs(5)),
            ..timing()
        };
        let last = || {
            Some(Last {
                started: t0,
                frame: &f,
            })
        };
        assert!(!due(
            &timing,
            last(),
            &f,
            Some(t0),
            t0 + Duration::from_secs(4)
        ));
        assert!(due(
            &timing,
            last(),
            &f,
            Some(t0),
            t0 + Duration::from_secs(5)
        ));
    }

    #[test]
    fn a_camera_is_silent_without_frames_or_past_the_limit() {
        let t0 = Instant::now();
        let f = frame(20, 1, t0);
        let two = Some(Duration::from_secs(2));
        assert!(silent(None, two, t0));
        assert!(!silent(Some(&f), two, t0 + Duration::from_secs(2)));
        assert!(silent(Some(&f), two, t0 + Duration::from_secs(3)));
        assert!(!silent(Some(&f), None, t0 + Duration::from_secs(300)));
    }
}
