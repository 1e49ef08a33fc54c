//! Images a conversation already holds. A follow-up about the same scene should not pay for
//! the vision tower again nor fill the window with the same ~100 rows: a turn's image that
//! carries an [`ImageKey`] already prefilled in the conversation is left out of the turn, and
//! only its question is added. The answer then refers to the earlier image block, which the
//! model still attends to (it is part of the state the conversation continues from).
//!
//! What a key names is the front end's business (the node: a camera topic and header stamp,
//! or the content hash of a request image, [`ImageKey::of_rgb`]); the runtime only compares
//! keys. The keys live in the [`super::Conversation`] beside the state snapshot they describe,
//! so they cannot disagree with it: a turn that is not kept leaves the conversation as it
//! was, and a conversation that is dropped (evicted, expired) takes its keys with it — the
//! next turn starts a fresh conversation and adds the image again.

use std::borrow::Cow;

use sha2::{Digest, Sha256};

use crate::engine::ImageInput;
use crate::vision::RgbImage;

/// The identity of an image within a conversation: equal keys mean "the same picture".
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageKey(String);

impl ImageKey {
    /// A key chosen by the front end (e.g. a camera topic and the frame's header stamp).
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The content hash of an RGB frame: SHA-256 over its size and pixels, so the same pixels
    /// give the same key whatever message or encoding brought them.
    pub fn of_rgb(img: &RgbImage) -> Self {
        let mut h = Sha256::new();
        h.update((img.width as u64).to_le_bytes());
        h.update((img.height as u64).to_le_bytes());
        h.update(&img.data);
        let digest = h.finalize();
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        Self(format!("sha256:{hex}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ImageKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a turn adds: the images not yet in the conversation, and the keys the conversation
/// holds once they are prefilled.
pub(super) struct NewImages<'a> {
    pub images: Cow<'a, [ImageInput]>,
    pub held: Vec<ImageKey>,
    /// Images left out because the conversation already holds them.
    pub skipped: usize,
}

/// Splits `images` (with `keys[i]` naming `images[i]`; a missing or `None` key means "always
/// add") against the keys `held` by the conversation. Two images of one turn with the same
/// key both go in: the client asked with both.
pub(super) fn new_images<'a>(
    images: &'a [ImageInput],
    keys: &[Option<ImageKey>],
    held: &[ImageKey],
) -> NewImages<'a> {
    let key = |i: usize| keys.get(i).and_then(Option::as_ref);
    let known = |i: usize| key(i).is_some_and(|k| held.contains(k));
    let skipped = (0..images.len()).filter(|&i| known(i)).count();
    let images = if skipped == 0 {
        Cow::Borrowed(images)
    } else {
        Cow::Owned(
            images
                .iter()
                .enumerate()
                .filter(|&(i, _)| !known(i))
                .map(|(_, img)| img.clone())
                .collect(),
        )
    };
    let mut held = held.to_vec();
    for k in (0..images.len().max(keys.len())).filter_map(key) {
        if !held.contains(k) {
            held.push(k.clone());
        }
    }
    NewImages {
        images,
        held,
        skipped,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn img(v: u8) -> ImageInput {
        ImageInput::Rgb(RgbImage::new(2, 2, vec![v; 12]).unwrap())
    }

    fn key(s: &str) -> Option<ImageKey> {
        Some(ImageKey::new(s))
    }

    #[test]
    fn held_images_are_left_out_and_new_ones_added() {
        let images = [img(1), img(2), img(3)];
        let keys = [key("a"), key("b"), None];
        let n = new_images(&images, &keys, &[ImageKey::new("b")]);
        assert_eq!(n.skipped, 1);
        assert_eq!(n.images.len(), 2);
        assert!(matches!(&n.images[0], ImageInput::Rgb(r) if r.data[0] == 1));
        assert!(matches!(&n.images[1], ImageInput::Rgb(r) if r.data[0] == 3));
        assert_eq!(n.held, vec![ImageKey::new("b"), ImageKey::new("a")]);

        let fresh = new_images(&images, &keys, &[]);
        assert_eq!(fresh.skipped, 0);
        assert!(matches!(fresh.images, Cow::Borrowed(_)));
        assert_eq!(fresh.held, vec![ImageKey::new("a"), ImageKey::new("b")]);
    }

    #[test]
    fn images_without_keys_are_always_added() {
        let images = [img(1), img(1)];
        let n = new_images(&images, &[], &[ImageKey::new("a")]);
        assert_eq!((n.skipped, n.images.len()), (0, 2));
        assert_eq!(n.held, vec![ImageKey::new("a")]);
    }

    #[test]
    fn the_content_key_follows_the_pixels_and_the_size() {
        let a = RgbImage::new(2, 3, vec![7; 18]).unwrap();
        let same = RgbImage::new(2, 3, vec![7; 18]).unwrap();
        let other = RgbImage::new(3, 2, vec![7; 18]).unwrap();
        let mut pixel = vec![7; 18];
        pixel[17] = 8;
        let pixel = RgbImage::new(2, 3, pixel).unwrap();
        assert_eq!(ImageKey::of_rgb(&a), ImageKey::of_rgb(&same));
        assert_ne!(ImageKey::of_rgb(&a), ImageKey::of_rgb(&other));
        assert_ne!(ImageKey::of_rgb(&a), ImageKey::of_rgb(&pixel));
        assert!(ImageKey::of_rgb(&a).as_str().starts_with("sha256:"));
        assert_eq!(ImageKey::of_rgb(&a).as_str().len(), "sha256:".len() + 64);
    }
}
