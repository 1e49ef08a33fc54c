//! Encoding names as `sensor_msgs/Image.encoding` and `CompressedImage.format` spell them.

use std::fmt;

/// An uncompressed pixel layout this crate converts to RGB8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PixelFormat {
    Rgb8,
    Bgr8,
    Rgba8,
    Bgra8,
    Mono8,
    /// 16-bit grey; byte order from `is_bigendian`; converted to 8 bit by `>> 8`.
    Mono16,
    /// Packed 4:2:2 `U Y0 V Y1` (sensor_msgs `yuv422`, also `uyvy`).
    Uyvy,
    /// Packed 4:2:2 `Y0 U Y1 V` (sensor_msgs `yuv422_yuy2`, also `yuyv`).
    Yuyv,
    /// 4:2:0: a Y plane then an interleaved `U V` plane at half height.
    Nv12,
}

impl PixelFormat {
    /// Bytes per pixel of a packed row; for NV12 the bytes per pixel of the Y plane.
    pub fn bytes_per_pixel(self) -> u32 {
        match self {
            Self::Rgb8 | Self::Bgr8 => 3,
            Self::Rgba8 | Self::Bgra8 => 4,
            Self::Mono8 | Self::Nv12 => 1,
            Self::Mono16 | Self::Uyvy | Self::Yuyv => 2,
        }
    }

    /// The canonical sensor_msgs name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rgb8 => "rgb8",
            Self::Bgr8 => "bgr8",
            Self::Rgba8 => "rgba8",
            Self::Bgra8 => "bgra8",
            Self::Mono8 => "mono8",
            Self::Mono16 => "mono16",
            Self::Uyvy => "yuv422",
            Self::Yuyv => "yuv422_yuy2",
            Self::Nv12 => "nv12",
        }
    }
}

/// A compressed payload this crate decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    Jpeg,
    Png,
}

impl Codec {
    /// The canonical name (`jpeg`, `png`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Jpeg => "jpeg",
            Self::Png => "png",
        }
    }

    /// The leading bytes every payload of this codec starts with.
    pub fn magic(self) -> &'static [u8] {
        match self {
            // SOI followed by the first marker's 0xFF.
            Self::Jpeg => &[0xFF, 0xD8, 0xFF],
            Self::Png => &[0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A],
        }
    }

    /// The codec whose signature starts `data`, if any.
    pub fn sniff(data: &[u8]) -> Option<Self> {
        [Self::Jpeg, Self::Png]
            .into_iter()
            .find(|c| data.starts_with(c.magic()))
    }

    fn from_token(token: &str) -> Option<Self> {
        match token {
            "jpeg" | "jpg" | "mjpeg" => Some(Self::Jpeg),
            "png" => Some(Self::Png),
            _ => None,
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a `sensor_msgs/Image.encoding` string denotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    Raw(PixelFormat),
    /// JPEG or PNG bytes carried inside `sensor_msgs/Image`, as D-Robotics USB cameras publish.
    Compressed(Codec),
}

impl Encoding {
    /// Parses an `Image.encoding` string.
    ///
    /// Matching ignores ASCII case and trailing NULs/whitespace (D-Robotics `HbmMsg*` messages
    /// carry the encoding NUL-padded in a `uint8[12]`). Accepted names: `rgb8`, `bgr8`, `rgba8`,
    /// `bgra8`, `mono8`, `mono16`, `yuv422` and `uyvy` (UYVY), `yuv422_yuy2` and `yuyv`
    /// (YUYV), `nv12`, `jpeg`/`jpg`/`mjpeg`, `png`.
    pub fn parse(encoding: &str) -> Option<Self> {
        let name = trim_name(encoding).to_ascii_lowercase();
        let raw = match name.as_str() {
            "rgb8" => PixelFormat::Rgb8,
            "bgr8" => PixelFormat::Bgr8,
            "rgba8" => PixelFormat::Rgba8,
            "bgra8" => PixelFormat::Bgra8,
            "mono8" => PixelFormat::Mono8,
            "mono16" => PixelFormat::Mono16,
            "yuv422" | "uyvy" => PixelFormat::Uyvy,
            "yuv422_yuy2" | "yuyv" => PixelFormat::Yuyv,
            "nv12" => PixelFormat::Nv12,
            other => return Codec::from_token(other).map(Self::Compressed),
        };
        Some(Self::Raw(raw))
    }

    /// The canonical name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Raw(p) => p.as_str(),
            Self::Compressed(c) => c.as_str(),
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a `CompressedImage.format` string asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompressedFormat {
    /// The string names this codec.
    Named(Codec),
    /// The string is empty: the codec is taken from the payload's signature.
    Sniff,
}

/// Parses `sensor_msgs/CompressedImage.format`.
///
/// Forms understood (ASCII case ignored):
/// - a bare codec: `jpeg`, `jpg`, `mjpeg`, `png`;
/// - `image_transport`'s `"<original encoding>; <codec> compressed [<encoding>]"`, e.g.
///   `"rgb8; jpeg compressed bgr8"`, `"bgr8; jpeg compressed "`, `"mono16; png compressed"`:
///   the codec is the first word after the `;` that names one;
/// - empty: the codec is sniffed from the payload.
///
/// `compressedDepth` payloads carry a private header before the PNG and are refused, as is any
/// codec other than jpeg/png (`tiff`, `h264`, ...).
pub fn parse_compressed_format(format: &str) -> Result<CompressedFormat, &'static str> {
    let name = trim_name(format).to_ascii_lowercase();
    if name.is_empty() {
        return Ok(CompressedFormat::Sniff);
    }
    if name.contains("compresseddepth") {
        return Err("compressedDepth payloads are not supported");
    }
    // A bare name, or the part after the first ';' for the image_transport form (the part
    // before it is the original pixel encoding, which may itself look like anything).
    let codec_part = match name.split_once(';') {
        Some((_, rest)) => rest,
        None => name.as_str(),
    };
    codec_part
        .split(|c: char| c.is_ascii_whitespace() || c == ',')
        .find_map(Codec::from_token)
        .map(CompressedFormat::Named)
        .ok_or("names no supported codec (jpeg, png)")
}

fn trim_name(s: &str) -> &str {
    s.trim_matches(|c: char| c == '\0' || c.is_ascii_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sensor_msgs_names_and_aliases() {
        let cases = [
            ("rgb8", Encoding::Raw(PixelFormat::Rgb8)),
            ("BGR8", Encoding::Raw(PixelFormat::Bgr8)),
            ("rgba8", Encoding::Raw(PixelFormat::Rgba8)),
            ("bgra8", Encoding::Raw(PixelFormat::Bgra8)),
            ("mono8", Encoding::Raw(PixelFormat::Mono8)),
            ("mono16", Encoding::Raw(PixelFormat::Mono16)),
            ("yuv422", Encoding::Raw(PixelFormat::Uyvy)),
            ("uyvy", Encoding::Raw(PixelFormat::Uyvy)),
            ("yuv422_yuy2", Encoding::Raw(PixelFormat::Yuyv)),
            ("yuyv", Encoding::Raw(PixelFormat::Yuyv)),
            ("nv12\0\0\0\0\0\0\0\0", Encoding::Raw(PixelFormat::Nv12)),
            ("jpeg", Encoding::Compressed(Codec::Jpeg)),
            ("png", Encoding::Compressed(Codec::Png)),
        ];
        for (s, want) in cases {
            assert_eq!(Encoding::parse(s), Some(want), "{s:?}");
        }
        for bad in ["", "rgb16", "nv21", "bayer_rggb8", "8UC3", "yuv420"] {
            assert_eq!(Encoding::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn parses_compressed_format_strings() {
        use CompressedFormat::*;
        let cases = [
            ("jpeg", Named(Codec::Jpeg)),
            ("JPEG", Named(Codec::Jpeg)),
            ("png", Named(Codec::Png)),
            ("rgb8; jpeg compressed bgr8", Named(Codec::Jpeg)),
            ("bgr8; jpeg compressed ", Named(Codec::Jpeg)),
            ("mono16; png compressed", Named(Codec::Png)),
            ("bgra8; png compressed bgra8", Named(Codec::Png)),
            ("", Sniff),
        ];
        for (s, want) in cases {
            assert_eq!(parse_compressed_format(s), Ok(want), "{s:?}");
        }
        for bad in ["tiff", "16UC1; compressedDepth png", "h264", "rgb8; raw"] {
            assert!(parse_compressed_format(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sniffs_signatures() {
        assert_eq!(Codec::sniff(&[0xFF, 0xD8, 0xFF, 0xE0]), Some(Codec::Jpeg));
        assert_eq!(
            Codec::sniff(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"),
            Some(Codec::Png)
        );
        assert_eq!(Codec::sniff(&[0xFF, 0xD8]), None);
        assert_eq!(Codec::sniff(b""), None);
    }
}
