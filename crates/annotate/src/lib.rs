//! Detections drawn on an RGB8 frame — what a person looks at to *see* what the robot found:
//! each box's outline or each point's dot in its own colour, and its label on a filled tag.
//! Used by `vlm detect --draw` and the node's `vlm/annotated` topic; nothing here knows ROS
//! or the model.
//!
//! Labels are set in DejaVu Sans Mono (Bitstream Vera licence, `fonts/`), bundled so that a
//! frame looks the same on the board and on a workstation.
#![forbid(unsafe_code)]

use ab_glyph::{Font, FontRef, PxScale, ScaleFont};

const FONT: &[u8] = include_bytes!("../fonts/DejaVuSansMono.ttf");

/// Outline colours, one per detection index in turn: saturated and far apart, readable on
/// most scenes.
pub const PALETTE: [[u8; 3]; 8] = [
    [255, 56, 56],
    [56, 200, 56],
    [40, 120, 255],
    [255, 200, 0],
    [255, 60, 220],
    [0, 220, 220],
    [255, 140, 0],
    [160, 90, 255],
];

/// What to draw, in pixels of the frame (x right, y down, origin at the top-left corner).
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// Corners of a box.
    Box {
        x1: f64,
        y1: f64,
        x2: f64,
        y2: f64,
    },
    Point {
        x: f64,
        y: f64,
    },
}

/// One detection to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    pub shape: Shape,
    /// Text on the tag ("cup 0.83"); empty: no tag.
    pub label: String,
    /// Picks the colour ([`PALETTE`]).
    pub index: usize,
}

/// Why a frame cannot be drawn on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotateError {
    #[error("an rgb8 frame of {width}x{height} needs {expected} bytes, got {found}")]
    Size {
        width: usize,
        height: usize,
        expected: usize,
        found: usize,
    },
}

/// Line width in pixels for a frame: 2 px at VGA, thicker on large frames.
pub fn line_width(width: usize, height: usize) -> usize {
    (width.min(height) / 240).max(1) + 1
}

/// Draws `marks` onto `rgb` (`width × height`, rows packed, 3 bytes a pixel) in order.
///
/// A box's outline lies inside the box: its left edge covers the columns from `⌊x1⌋` on,
/// its right edge the columns up to `⌈x2⌉ − 1`, [`line_width`] pixels each (likewise rows),
/// so every drawn pixel belongs to the box and the frame. A point is a filled square of
/// `3 × line_width` around it. Shapes are clipped to the frame.
pub fn draw(
    rgb: &mut [u8],
    width: usize,
    height: usize,
    marks: &[Mark],
) -> Result<(), AnnotateError> {
    let expected = width * height * 3;
    if rgb.len() != expected {
        return Err(AnnotateError::Size {
            width,
            height,
            expected,
            found: rgb.len(),
        });
    }
    let mut canvas = Canvas { rgb, width, height };
    let t = line_width(width, height);
    let font = FontRef::try_from_slice(FONT).ok();
    for m in marks {
        let colour = PALETTE[m.index % PALETTE.len()];
        let (tag_x, tag_y) = match m.shape {
            Shape::Box { x1, y1, x2, y2 } => {
                let (l, r) = span(x1.min(x2), x1.max(x2), width);
                let (top, bottom) = span(y1.min(y2), y1.max(y2), height);
                if l >= r || top >= bottom {
                    continue;
                }
                let tw = t.min(r - l);
                let th = t.min(bottom - top);
                canvas.fill(l, top, r, top + th, colour);
                canvas.fill(l, bottom - th, r, bottom, colour);
                canvas.fill(l, top, l + tw, bottom, colour);
                canvas.fill(r - tw, top, r, bottom, colour);
                (l, top)
            }
            Shape::Point { x, y } => {
                let r = (3 * t / 2) as f64;
                let (l, rr) = span(x - r, x + r, width);
                let (top, bottom) = span(y - r, y + r, height);
                canvas.fill(l, top, rr, bottom, colour);
                (l, bottom)
            }
        };
        if let (Some(f), false) = (&font, m.label.is_empty()) {
            canvas.tag(f, &m.label, tag_x, tag_y, colour);
        }
    }
    Ok(())
}

/// Pixel columns (or rows) `[first, end)` a continuous span covers, clipped to `0..size`.
fn span(a: f64, b: f64, size: usize) -> (usize, usize) {
    let clip = |v: f64| v.clamp(0.0, size as f64);
    let first = clip(a).floor() as usize;
    let end = (clip(b).ceil() as usize).max(first);
    (first.min(size), end.min(size))
}

struct Canvas<'a> {
    rgb: &'a mut [u8],
    width: usize,
    height: usize,
}

impl Canvas<'_> {
    /// Fills `[x0, x1) × [y0, y1)` (clipped).
    fn fill(&mut self, x0: usize, y0: usize, x1: usize, y1: usize, c: [u8; 3]) {
        let (x1, y1) = (x1.min(self.width), y1.min(self.height));
        for y in y0..y1 {
            for x in x0..x1 {
                let i = (y * self.width + x) * 3;
                self.rgb[i..i + 3].copy_from_slice(&c);
            }
        }
    }

    /// Blends `c` over pixel `(x, y)` with coverage `a` (0–1); outside the frame: nothing.
    fn blend(&mut self, x: i64, y: i64, c: [u8; 3], a: f32) {
        if x < 0 || y < 0 || x as usize >= self.width || y as usize >= self.height {
            return;
        }
        let i = (y as usize * self.width + x as usize) * 3;
        for (dst, &src) in self.rgb[i..i + 3].iter_mut().zip(&c) {
            let old = f32::from(*dst);
            *dst = (old + (f32::from(src) - old) * a.clamp(0.0, 1.0)).round() as u8;
        }
    }

    /// The label on a tag of the mark's colour, above `(x, y)` when there is room (below
    /// otherwise), kept inside the frame; dark or light text, whichever reads on the colour.
    fn tag(&mut self, font: &FontRef<'_>, text: &str, x: usize, y: usize, c: [u8; 3]) {
        let px = (self.width.min(self.height) as f32 / 24.0).clamp(11.0, 32.0);
        let scaled = font.as_scaled(PxScale::from(px));
        let pad = (px / 6.0).ceil() as usize;
        let advance: f32 = text
            .chars()
            .map(|ch| scaled.h_advance(scaled.glyph_id(ch)))
            .sum();
        let tw = (advance.ceil() as usize + 2 * pad).min(self.width);
        let th = (scaled.height().ceil() as usize + 2 * pad).min(self.height);
        let left = x.min(self.width - tw);
        let top = if y >= th {
            y - th
        } else {
            y.min(self.height - th)
        };
        self.fill(left, top, left + tw, top + th, c);
        let luma = 0.299 * f32::from(c[0]) + 0.587 * f32::from(c[1]) + 0.114 * f32::from(c[2]);
        let ink = if luma > 140.0 {
            [0, 0, 0]
        } else {
            [255, 255, 255]
        };
        let mut pen = (left + pad) as f32;
        let baseline = (top + pad) as f32 + scaled.ascent();
        for ch in text.chars() {
            let id = scaled.glyph_id(ch);
            let glyph = id.with_scale_and_position(px, ab_glyph::point(pen, baseline));
            pen += scaled.h_advance(id);
            if let Some(outline) = font.outline_glyph(glyph) {
                let b = outline.px_bounds();
                outline.draw(|gx, gy, a| {
                    self.blend(
                        b.min.x as i64 + gx as i64,
                        b.min.y as i64 + gy as i64,
                        ink,
                        a,
                    );
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grey(w: usize, h: usize) -> Vec<u8> {
        vec![128; w * h * 3]
    }

    fn px(rgb: &[u8], w: usize, x: usize, y: usize) -> [u8; 3] {
        let i = (y * w + x) * 3;
        [rgb[i], rgb[i + 1], rgb[i + 2]]
    }

    #[test]
    fn a_box_edge_is_drawn_on_its_pixels_and_nowhere_outside() {
        let (w, h) = (640, 480);
        let mut img = grey(w, h);
        let mark = Mark {
            shape: Shape::Box {
                x1: 64.0,
                y1: 96.0,
                x2: 192.0,
                y2: 192.0,
            },
            label: String::new(),
            index: 0,
        };
        draw(&mut img, w, h, &[mark]).unwrap();
        let c = PALETTE[0];
        let t = line_width(w, h);
        assert_eq!(t, 3);
        // Left and right edges mid-height, top and bottom edges mid-width.
        for x in 64..64 + t {
            assert_eq!(px(&img, w, x, 150), c);
        }
        for x in 192 - t..192 {
            assert_eq!(px(&img, w, x, 150), c);
        }
        assert_eq!(px(&img, w, 128, 96), c);
        assert_eq!(px(&img, w, 128, 191), c);
        // Just outside and just inside the line: untouched.
        for (x, y) in [
            (63, 150),
            (192, 150),
            (64 + t, 150),
            (128, 95),
            (128, 192),
            (128, 144),
        ] {
            assert_eq!(px(&img, w, x, y), [128; 3], "({x},{y})");
        }
    }

    #[test]
    fn labels_points_and_clipping() {
        let (w, h) = (200, 100);
        let mut img = grey(w, h);
        let marks = [
            Mark {
                shape: Shape::Box {
                    x1: 150.0,
                    y1: -20.0,
                    x2: 400.0,
                    y2: 50.0,
                },
                label: "door 0.91".into(),
                index: 1,
            },
            Mark {
                shape: Shape::Point { x: 20.0, y: 80.0 },
                label: "cup".into(),
                index: 2,
            },
        ];
        draw(&mut img, w, h, &marks).unwrap();
        assert_eq!(px(&img, w, 199, 25), PALETTE[1], "clipped right edge");
        assert_eq!(px(&img, w, 20, 80), PALETTE[2]);
        // The tags hold ink of the text's colour: some pixels are neither grey nor a palette
        // colour.
        let odd = img
            .chunks(3)
            .filter(|p| p != &[128; 3] && !PALETTE.iter().any(|c| c == p))
            .count();
        assert!(odd > 20, "{odd}");
        assert!(draw(&mut img[..10], w, h, &marks).is_err());
    }
}
