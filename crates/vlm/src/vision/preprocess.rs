//! Any frame → the tower's input `[n_patch, 3·T·P·P]`: resize to the bucket, then the
//! model's own normalise + patchify (`qwen35::patchify`, the HF processor's order and
//! arithmetic).

use super::resize::{resize_bicubic, RgbImage};
use super::VisionError;

/// Tower input geometry for one square bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bucket side in pixels (320 for the published package).
    pub side: usize,
    pub patch: usize,
    pub merge: usize,
    pub temporal: usize,
}

impl Geometry {
    /// Checks that the bucket splits into whole merge blocks, and that the tower input's
    /// size in bytes (`4·3·T·side²`, which bounds every other product of the geometry: `P`
    /// divides `side`) fits a `usize`, so the methods below need no checks of their own.
    pub fn new(
        side: usize,
        patch: usize,
        merge: usize,
        temporal: usize,
    ) -> Result<Self, VisionError> {
        let block = patch
            .checked_mul(merge)
            .ok_or_else(|| VisionError::Overflow(format!("patch {patch} × merge {merge}")))?;
        if side == 0 || patch == 0 || merge == 0 || temporal == 0 || !side.is_multiple_of(block) {
            return Err(VisionError::BadGeometry { side, patch, merge });
        }
        let bytes = side
            .checked_mul(side)
            .and_then(|x| x.checked_mul(temporal))
            .and_then(|x| x.checked_mul(3 * 4));
        if bytes.is_none() {
            return Err(VisionError::Overflow(format!(
                "3 × temporal {temporal} × {side}² f32 values"
            )));
        }
        Ok(Self {
            side,
            patch,
            merge,
            temporal,
        })
    }

    /// Derives the bucket from the tower's input shape `[n_patch, row_len]`, as BLLM does:
    /// `side = sqrt(n_patch) · patch`, and `row_len` must equal `3·T·P·P`.
    pub fn from_tower_input(
        n_patch: usize,
        row_len: usize,
        patch: usize,
        merge: usize,
        temporal: usize,
    ) -> Result<Self, VisionError> {
        let overflow = || {
            VisionError::Overflow(format!(
                "{n_patch} patches of patch {patch}, temporal {temporal}"
            ))
        };
        let grid = (n_patch as f64).sqrt().round() as usize;
        let side = grid.checked_mul(patch).ok_or_else(overflow)?;
        let want_row = patch
            .checked_mul(patch)
            .and_then(|x| x.checked_mul(temporal))
            .and_then(|x| x.checked_mul(3))
            .ok_or_else(overflow)?;
        if grid.checked_mul(grid) != Some(n_patch) || row_len != want_row {
            return Err(VisionError::BadGeometry { side, patch, merge });
        }
        Self::new(side, patch, merge, temporal)
    }

    /// Patches per side.
    pub fn grid(&self) -> usize {
        self.side / self.patch
    }

    /// Merged tokens per side (`G`; 10 for 320 px): the M-RoPE advance of one image.
    pub fn merged_side(&self) -> usize {
        self.grid() / self.merge
    }

    /// Tower input rows (400 for 320 px).
    pub fn n_patch(&self) -> usize {
        self.grid() * self.grid()
    }

    /// Length of one patch row (1536 for patch 16, temporal 2).
    pub fn row_len(&self) -> usize {
        3 * self.temporal * self.patch * self.patch
    }

    /// Tower output rows = LLM tokens per image (100 for 320 px).
    pub fn n_tokens(&self) -> usize {
        self.merged_side() * self.merged_side()
    }
}

/// Tower input: `rows × row_len` f32, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelValues {
    pub rows: usize,
    pub row_len: usize,
    pub data: Vec<f32>,
}

/// Any RGB8 frame → resize straight to the bucket (aspect ratio not kept, as BLLM does) →
/// normalise → patchify.
pub fn preprocess(
    img: &RgbImage,
    geom: &Geometry,
    mean: [f32; 3],
    std: [f32; 3],
) -> Result<PixelValues, VisionError> {
    let resized = resize_bicubic(img, geom.side, geom.side)?;
    patchify_merged(&resized, geom, mean, std)
}

/// Normalises and patchifies an image that already has the bucket size.
pub fn patchify_merged(
    img: &RgbImage,
    geom: &Geometry,
    mean: [f32; 3],
    std: [f32; 3],
) -> Result<PixelValues, VisionError> {
    if img.width != geom.side || img.height != geom.side {
        return Err(VisionError::BadGeometry {
            side: img.width.max(img.height),
            patch: geom.patch,
            merge: geom.merge,
        });
    }
    let layout = qwen35::PatchLayout {
        patch: geom.patch,
        merge: geom.merge,
        temporal: geom.temporal,
    };
    let (data, _) = qwen35::patchify(
        &img.data,
        img.width,
        img.height,
        layout,
        qwen35::Normalise { mean, std },
    )
    .map_err(|e| VisionError::Patchify(e.to_string()))?;
    Ok(PixelValues {
        rows: geom.n_patch(),
        row_len: geom.row_len(),
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_of_the_published_bucket() {
        let g = Geometry::from_tower_input(400, 1536, 16, 2, 2).unwrap();
        assert_eq!(
            (g.side, g.grid(), g.merged_side(), g.n_tokens()),
            (320, 20, 10, 100)
        );
        assert!(Geometry::from_tower_input(399, 1536, 16, 2, 2).is_err());
        assert!(Geometry::from_tower_input(400, 1500, 16, 2, 2).is_err());
        assert!(
            Geometry::new(336, 16, 2, 2).is_err(),
            "336 is not a multiple of 32"
        );
        assert_eq!(Geometry::new(448, 16, 2, 2).unwrap().n_tokens(), 196);
    }

    /// Sizes from a package or a graph's shape whose products overflow are an error, never
    /// a panic or a wrapped size.
    #[test]
    fn overflowing_geometry_is_an_error() {
        let big = usize::MAX / 2 + 1;
        for r in [
            Geometry::new(big, big, 2, 1),
            Geometry::new(1 << 40, 1 << 20, 2, 1),
            Geometry::new(1 << 32, 16, 2, 2),
            Geometry::from_tower_input(400, 1536, big, 2, 2),
            Geometry::from_tower_input(400, 1536, 1 << 31, 2, 1 << 40),
        ] {
            assert!(matches!(r, Err(VisionError::Overflow(_))), "{r:?}");
        }
        let r = Geometry::from_tower_input(usize::MAX, 1536, 16, 2, 2);
        assert!(matches!(r, Err(VisionError::BadGeometry { .. })), "{r:?}");
    }

    /// Independent reference: the flat output index decomposed as the HF processor's
    /// reshape `(C, gh/m, m, P, gw/m, m, P)` → transpose `(gh/m, gw/m, m, m, C, [T], P, P)`.
    #[test]
    fn patch_order_matches_the_reshape_transpose_definition() {
        let geom = Geometry::new(8, 2, 2, 2).unwrap();
        let data: Vec<u8> = (0..8 * 8 * 3).map(|i| (i * 7 % 256) as u8).collect();
        let img = RgbImage::new(8, 8, data.clone()).unwrap();
        let mean = [0.1, 0.2, 0.3];
        let std = [0.5, 0.25, 2.0];
        let pv = patchify_merged(&img, &geom, mean, std).unwrap();
        assert_eq!((pv.rows, pv.row_len), (16, 24));
        let (p, m, t, g) = (2, 2, 2, 2);
        for (idx, &v) in pv.data.iter().enumerate() {
            let mut r = idx;
            let px = r % p;
            r /= p;
            let py = r % p;
            r /= p;
            let _frame = r % t;
            r /= t;
            let c = r % 3;
            r /= 3;
            let mw = r % m;
            r /= m;
            let mh = r % m;
            r /= m;
            let bw = r % g;
            let bh = r / g;
            let y = (bh * m + mh) * p + py;
            let x = (bw * m + mw) * p + px;
            let raw = f32::from(data[(y * 8 + x) * 3 + c]);
            let want = (raw / 255.0 - mean[c]) / std[c];
            assert!((v - want).abs() < 1e-6, "idx {idx}: {v} vs {want}");
        }
    }

    #[test]
    fn preprocess_resizes_any_frame_to_the_bucket() {
        let geom = Geometry::new(32, 4, 2, 2).unwrap();
        let img = RgbImage::new(50, 20, vec![255; 50 * 20 * 3]).unwrap();
        let pv = preprocess(&img, &geom, [0.5; 3], [0.5; 3]).unwrap();
        assert_eq!(pv.rows, 64);
        assert!(pv.data.iter().all(|&v| v == 1.0));
        let wrong = RgbImage::new(31, 32, vec![0; 31 * 32 * 3]).unwrap();
        assert!(patchify_merged(&wrong, &geom, [0.5; 3], [0.5; 3]).is_err());
    }
}
