//! Caps on what decoding a set of images (one request's) may take, checked from the headers
//! before any pixel is decoded: a few KB of png can say 8192×8192 RGBA16 (512 MiB decoded).

use crate::validate::Layout;

/// The pixel cap of one image and the decoded bytes all images of one set may take together.
///
/// Each image is charged [`Layout::decoded_bytes`], what its conversion holds at its peak; the
/// images of a request are converted one after the other and kept as RGB8 (never more than
/// that charge each), so the charges' sum bounds the memory the set takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeBudget {
    max_pixels: u64,
    max_bytes: u64,
    used: u64,
}

/// An image the [`DecodeBudget`] refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// One image has more pixels than the cap.
    #[error("{width}x{height} is {pixels} pixels, above the limit of {max}")]
    TooManyPixels {
        width: u32,
        height: u32,
        pixels: u64,
        max: u64,
    },
    /// Decoding the image would take the set's decoded bytes over the budget.
    #[error(
        "decoding it takes {needed} bytes, with {used} taken by the images before it that is \
         above the budget of {max} bytes"
    )]
    OverBudget { needed: u64, used: u64, max: u64 },
}

impl DecodeBudget {
    /// At most `max_pixels` per image and `max_bytes` decoded for the whole set.
    pub fn new(max_pixels: u64, max_bytes: u64) -> Self {
        Self {
            max_pixels,
            max_bytes,
            used: 0,
        }
    }

    /// Charges one image, in the order the images are decoded; a refused image charges
    /// nothing. Returns the bytes charged.
    pub fn charge(&mut self, layout: &Layout) -> Result<u64, BudgetError> {
        let pixels = layout.pixels();
        if pixels > self.max_pixels {
            return Err(BudgetError::TooManyPixels {
                width: layout.width(),
                height: layout.height(),
                pixels,
                max: self.max_pixels,
            });
        }
        let needed = layout.decoded_bytes();
        match self.used.checked_add(needed) {
            Some(total) if total <= self.max_bytes => {
                self.used = total;
                Ok(needed)
            }
            _ => Err(BudgetError::OverBudget {
                needed,
                used: self.used,
                max: self.max_bytes,
            }),
        }
    }

    /// The bytes charged so far.
    pub fn used(&self) -> u64 {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoding::{Codec, PixelFormat};
    use crate::validate::{CompressedLayout, RawLayout};

    fn png(side: u32, bytes_per_pixel: u32) -> Layout {
        Layout::Compressed(CompressedLayout {
            codec: Codec::Png,
            width: side,
            height: side,
            decode_bytes_per_pixel: bytes_per_pixel,
        })
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_pixel_cap_is_per_image_and_inclusive() {
        let mut b = DecodeBudget::new(4096 * 4096, u64::MAX);
        assert_eq!(b.charge(&png(4096, 4)), Ok(64 * MIB));
        let e = b.charge(&png(8192, 4)).unwrap_err();
        assert_eq!(
            e,
            BudgetError::TooManyPixels {
                width: 8192,
                height: 8192,
                pixels: 8192 * 8192,
                max: 4096 * 4096,
            }
        );
        assert!(e.to_string().contains("8192x8192"), "{e}");
        assert_eq!(b.used(), 64 * MIB, "a refused image charges nothing");
    }

    /// w·h·channels·bytes per sample, at least the RGB8 output, summed over the set.
    #[test]
    fn decoded_bytes_add_up_to_the_budget_and_no_further() {
        assert_eq!(png(4096, 8).decoded_bytes(), 128 * MIB, "rgba16");
        assert_eq!(png(4096, 6).decoded_bytes(), 96 * MIB, "rgb16");
        assert_eq!(
            png(4096, 1).decoded_bytes(),
            48 * MIB,
            "grey: the rgb8 it becomes"
        );
        let raw = Layout::Raw(RawLayout {
            format: PixelFormat::Mono16,
            width: 4096,
            height: 4096,
            step: 8192,
            plane_rows: 4096,
            big_endian: false,
        });
        assert_eq!(raw.decoded_bytes(), 48 * MIB, "raw: its rgb8 output");
        let jpeg = Layout::Compressed(CompressedLayout {
            codec: Codec::Jpeg,
            width: 4096,
            height: 4096,
            decode_bytes_per_pixel: 3 + 2 * 3,
        });
        assert_eq!(
            jpeg.decoded_bytes(),
            144 * MIB,
            "progressive: output + coefficients"
        );

        // Four rgba8 images at 4096² fill 256 MiB exactly.
        let mut b = DecodeBudget::new(4096 * 4096, 256 * MIB);
        for _ in 0..4 {
            b.charge(&png(4096, 4)).unwrap();
        }
        assert_eq!(b.used(), 256 * MIB);
        assert_eq!(
            b.charge(&png(1, 4)),
            Err(BudgetError::OverBudget {
                needed: 4,
                used: 256 * MIB,
                max: 256 * MIB,
            })
        );
        // Rgba16 at 4096²: the third one is over.
        let mut b = DecodeBudget::new(4096 * 4096, 256 * MIB);
        assert!(b.charge(&png(4096, 8)).is_ok());
        assert!(b.charge(&png(4096, 8)).is_ok());
        assert!(matches!(
            b.charge(&png(4096, 8)),
            Err(BudgetError::OverBudget { .. })
        ));
    }

    #[test]
    fn no_overflow_near_the_top() {
        let mut b = DecodeBudget::new(u64::MAX, u64::MAX);
        assert!(b.charge(&png(u32::MAX, u32::MAX)).is_ok());
        assert!(b.charge(&png(u32::MAX, u32::MAX)).is_err());
    }
}
