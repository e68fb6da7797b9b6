//! Media (course parity): tweet photos and avatars, validated by their content (not their file
//! name), stored through the `object_store` abstraction (a local directory by default, any
//! S3-compatible store by configuration) and served back under `/media/`.
//!
//! A file is stored *before* the row that names it is committed, under a fresh random key, and
//! deleted again if that commit fails, so a failed upload leaves neither a row nor a file;
//! files of a deleted tweet, or a replaced avatar, are deleted after the commit.

use std::sync::Arc;

use anyhow::Context;
use axum::body::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use rand::RngCore;

use crate::config::Config;

/// Largest file accepted, in bytes (5 MiB).
pub const MAX_FILE_BYTES: usize = 5 * 1024 * 1024;
/// Most photos per tweet.
pub const MAX_PHOTOS: usize = 9;
/// The image types accepted: `(MIME type, file extension)`.
const IMAGES: [(&str, &str); 4] = [
    ("image/jpeg", "jpg"),
    ("image/png", "png"),
    ("image/gif", "gif"),
    ("image/webp", "webp"),
];
/// Largest width and height accepted, pixels (as Twitter's media upload).
pub const MAX_SIDE: u32 = 8192;
/// What a file that is not an accepted image is told.
const NOT_AN_IMAGE: &str = "Upload a valid image: JPEG, PNG, GIF or WebP.";
/// The path every media URL starts with.
pub const ROUTE: &str = "/media/";

/// A file sent in a multipart body.
#[derive(Debug, Clone)]
pub struct Upload {
    /// The form field it came in.
    pub field: String,
    /// Its bytes, or `None` if it was larger than [`MAX_FILE_BYTES`] (the rest was not read).
    pub bytes: Option<Bytes>,
}

/// The media store and how its URLs are written.
#[derive(Clone)]
pub struct Media {
    store: Arc<dyn ObjectStore>,
    /// `CHIRP_PUBLIC_URL` without a trailing `/`, or empty for root-relative URLs.
    public_url: String,
}

impl std::fmt::Debug for Media {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Media({})", self.store)
    }
}

impl Media {
    /// The store of `CHIRP_MEDIA_STORE`: `s3://bucket[/prefix]` (credentials, region and
    /// endpoint from the usual `AWS_*` variables, e.g. `AWS_ENDPOINT` for MinIO), else a local
    /// directory (created if missing).
    ///
    /// # Errors
    /// The directory can not be created, or the S3 configuration is incomplete.
    pub fn new(config: &Config) -> anyhow::Result<Self> {
        let target = config.media_store.trim();
        let store: Arc<dyn ObjectStore> = if target.starts_with("s3://") {
            Arc::new(
                object_store::aws::AmazonS3Builder::from_env()
                    .with_url(target)
                    .build()
                    .context("configuring the S3 media store")?,
            )
        } else {
            std::fs::create_dir_all(target)
                .with_context(|| format!("creating the media directory {target}"))?;
            Arc::new(
                object_store::local::LocalFileSystem::new_with_prefix(target)
                    .with_context(|| format!("opening the media directory {target}"))?,
            )
        };
        Ok(Media {
            store,
            public_url: config
                .public_url
                .as_deref()
                .unwrap_or("")
                .trim_end_matches('/')
                .to_owned(),
        })
    }

    /// Checks uploads of field `field` before anything is stored: at most `max` files, each an
    /// image of at most [`MAX_FILE_BYTES`] and [`MAX_SIDE`] pixels a side whose header decodes
    /// (`imagesize`) and whose container parses (`img-parts`: a JPEG's segments up to its
    /// image data, a PNG's and a WebP's chunks; a GIF must start with its signature and end
    /// with its trailer). The pixel data itself is not decoded. Returns each file's bytes **without its
    /// metadata** ([`strip_metadata`]) and its extension.
    ///
    /// # Errors
    /// The message for a 400 naming `field`.
    pub fn check(
        uploads: &[Upload],
        field: &str,
        max: usize,
    ) -> Result<Vec<(Bytes, &'static str)>, String> {
        let files: Vec<&Upload> = uploads.iter().filter(|u| u.field == field).collect();
        if files.len() > max {
            return Err(format!("At most {max} files may be uploaded."));
        }
        files
            .into_iter()
            .map(|u| {
                let bytes = u.bytes.clone().ok_or_else(|| {
                    format!("A file may be at most {} MiB.", MAX_FILE_BYTES >> 20)
                })?;
                let ext = match imagesize::image_type(&bytes) {
                    Ok(imagesize::ImageType::Jpeg) => "jpg",
                    Ok(imagesize::ImageType::Png) => "png",
                    Ok(imagesize::ImageType::Gif) => "gif",
                    Ok(imagesize::ImageType::Webp) => "webp",
                    _ => return Err(NOT_AN_IMAGE.to_owned()),
                };
                let size = imagesize::blob_size(&bytes).map_err(|_| NOT_AN_IMAGE.to_owned())?;
                if size.width == 0 || size.height == 0 {
                    return Err(NOT_AN_IMAGE.to_owned());
                }
                if size.width > MAX_SIDE as usize || size.height > MAX_SIDE as usize {
                    return Err(format!(
                        "An image may be at most {MAX_SIDE} pixels wide and high."
                    ));
                }
                let clean = strip_metadata(bytes, ext).ok_or_else(|| NOT_AN_IMAGE.to_owned())?;
                Ok((clean, ext))
            })
            .collect()
    }

    /// Stores checked files under `{dir}/{random}.{ext}`; returns their URLs in order. If one
    /// fails, the ones stored already are deleted again.
    ///
    /// # Errors
    /// The store failed.
    pub async fn put_all(
        &self,
        dir: &str,
        files: Vec<(Bytes, &'static str)>,
    ) -> anyhow::Result<Vec<String>> {
        let mut urls = Vec::with_capacity(files.len());
        for (bytes, ext) in files {
            let mut id = [0u8; 16];
            rand::rng().fill_bytes(&mut id);
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            let key = format!("{dir}/{hex}.{ext}");
            if let Err(e) = self
                .store
                .put(&Path::from(key.as_str()), PutPayload::from(bytes))
                .await
            {
                self.delete_urls(&urls).await;
                return Err(e).context("storing an upload");
            }
            urls.push(format!("{}{ROUTE}{key}", self.public_url));
        }
        Ok(urls)
    }

    /// Deletes the files behind media URLs of this store (others are left alone). Best effort:
    /// a file that can not be deleted is logged and left behind.
    pub async fn delete_urls(&self, urls: &[String]) {
        for url in urls {
            let Some(key) = self.key_of(url) else {
                continue;
            };
            if let Err(e) = self.store.delete(&Path::from(key)).await
                && !matches!(e, object_store::Error::NotFound { .. })
            {
                tracing::warn!(error = %e, url, "could not delete a media file");
            }
        }
    }

    /// Whether `url` is one of our files under directory `dir`.
    pub fn is_in(&self, url: &str, dir: &str) -> bool {
        self.key_of(url)
            .and_then(|k| k.strip_prefix(dir))
            .is_some_and(|rest| rest.starts_with('/'))
    }

    /// The store key of one of our URLs.
    fn key_of<'a>(&self, url: &'a str) -> Option<&'a str> {
        url.strip_prefix(self.public_url.as_str())?
            .strip_prefix(ROUTE)
            .filter(|k| !k.is_empty() && !k.split('/').any(|s| s == ".." || s.is_empty()))
    }

    /// The file at `key` (the path after `/media/`) as a stream of chunks, with its size in
    /// bytes and its MIME type; `None` if there is no such file. The file is never held whole
    /// in memory.
    ///
    /// # Errors
    /// The store failed.
    pub async fn open(&self, key: &str) -> anyhow::Result<Option<StoredFile>> {
        // Only a key that `put_all` can have issued names a file; anything else is no file,
        // never a store error (a name too long for the file system, or a path through a file,
        // was a 500).
        let Some(mime) = issued_mime(key) else {
            return Ok(None);
        };
        match self.store.get(&Path::from(key)).await {
            Ok(found) => Ok(Some(StoredFile {
                size: found.meta.size,
                mime,
                chunks: found.into_stream(),
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e).context("reading a media file"),
        }
    }
}

/// The MIME type of `key` if it has a shape that [`Media::put_all`] issues:
/// `photos/{32 hex}.{ext}` or `avatars/{user id}/{32 hex}.{ext}`, with the extension of one of
/// the [`IMAGES`].
fn issued_mime(key: &str) -> Option<&'static str> {
    let (dir, file) = key.rsplit_once('/')?;
    let user_dir = dir
        .strip_prefix("avatars/")
        .is_some_and(|id| (1..=19).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_digit()));
    let (name, ext) = file.split_once('.')?;
    let random = name.len() == 32 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let (mime, _) = IMAGES.iter().find(|(_, e)| *e == ext)?;
    ((dir == "photos" || user_dir) && random).then_some(*mime)
}

/// An EXIF block (TIFF, big-endian) that holds only the orientation of `exif` (another EXIF
/// block, as a JPEG's APP1 or a PNG's `eXIf` carries it), read and written with
/// `kamadak-exif`; `None` when it has none, or the default (1: upright), or does not parse.
fn orientation_only(exif: &[u8]) -> Option<Bytes> {
    use exif::{Field, In, Tag, Value};
    let read = exif::Reader::new().read_raw(exif.to_vec()).ok()?;
    let orientation = read
        .get_field(Tag::Orientation, In::PRIMARY)?
        .value
        .get_uint(0)?;
    if !(2..=8).contains(&orientation) {
        return None;
    }
    let field = Field {
        tag: Tag::Orientation,
        ifd_num: In::PRIMARY,
        value: Value::Short(vec![u16::try_from(orientation).ok()?]),
    };
    let mut writer = exif::experimental::Writer::new();
    writer.push_field(&field);
    let mut out = std::io::Cursor::new(Vec::new());
    writer.write(&mut out, false).ok()?;
    Some(Bytes::from(out.into_inner()))
}

/// A stored file being read ([`Media::open`]).
pub struct StoredFile {
    /// Bytes.
    pub size: u64,
    pub mime: &'static str,
    pub chunks: futures_util::stream::BoxStream<'static, object_store::Result<Bytes>>,
}

/// `bytes` of an image of type `ext` without its metadata: EXIF (with the GPS position and
/// the camera), XMP, IPTC and comments; for PNG also text chunks and the modification time.
/// The pixels and the colour profile are kept byte for byte (no re-encoding). A JPEG's or
/// PNG's EXIF orientation stays, alone in a new EXIF block ([`orientation_only`]), so a photo a
/// phone stored sideways with an orientation tag still shows upright (a WebP's goes: browsers
/// do not apply it). GIF carries no EXIF and is kept as is. `None` if the container does not
/// parse.
pub fn strip_metadata(bytes: Bytes, ext: &str) -> Option<Bytes> {
    use img_parts::ImageEXIF;
    match ext {
        "jpg" => {
            use img_parts::jpeg::{Jpeg, markers};
            let mut jpeg = Jpeg::from_bytes(bytes).ok()?;
            let kept = jpeg.exif().and_then(|e| orientation_only(&e));
            jpeg.segments_mut()
                .retain(|s| !matches!(s.marker(), markers::APP1 | markers::APP13 | markers::COM));
            if kept.is_some() {
                jpeg.set_exif(kept);
            }
            Some(jpeg.encoder().bytes())
        }
        "png" => {
            use img_parts::png::Png;
            let mut png = Png::from_bytes(bytes).ok()?;
            let kept = png.exif().and_then(|e| orientation_only(&e));
            png.chunks_mut()
                .retain(|c| !matches!(&c.kind(), b"eXIf" | b"tEXt" | b"zTXt" | b"iTXt" | b"tIME"));
            if kept.is_some() {
                png.set_exif(kept);
            }
            Some(png.encoder().bytes())
        }
        "webp" => {
            // By hand: img-parts' `set_exif` rebuilds the extended header from the ICC profile
            // and EXIF alone, and drops it from an image with alpha or animation but neither.
            use img_parts::riff::{RiffChunk, RiffContent};
            use img_parts::webp::{CHUNK_EXIF, CHUNK_VP8X, CHUNK_XMP, WebP};
            /// VP8X flags: EXIF and XMP present.
            const EXIF_AND_XMP: u8 = 0x08 | 0x04;
            let mut webp = WebP::from_bytes(bytes).ok()?;
            webp.remove_chunks_by_id(CHUNK_EXIF);
            webp.remove_chunks_by_id(CHUNK_XMP);
            for chunk in webp.chunks_mut() {
                if chunk.id() != CHUNK_VP8X {
                    continue;
                }
                let mut header = chunk.content().data()?.to_vec();
                *header.first_mut()? &= !EXIF_AND_XMP;
                *chunk = RiffChunk::new(CHUNK_VP8X, RiffContent::Data(Bytes::from(header)));
            }
            Some(webp.encoder().bytes())
        }
        "gif" => {
            let framed = (bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a"))
                && bytes.last() == Some(&0x3B);
            framed.then_some(bytes)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exif::{Field, In, Tag, Value};
    use img_parts::ImageEXIF;

    /// An EXIF block of a camera `Phone` that stored the photo with `orientation`.
    fn camera_exif(orientation: u16) -> Bytes {
        let make = Field {
            tag: Tag::Make,
            ifd_num: In::PRIMARY,
            value: Value::Ascii(vec![b"Phone".to_vec()]),
        };
        let turned = Field {
            tag: Tag::Orientation,
            ifd_num: In::PRIMARY,
            value: Value::Short(vec![orientation]),
        };
        let mut writer = exif::experimental::Writer::new();
        writer.push_field(&make);
        writer.push_field(&turned);
        let mut out = std::io::Cursor::new(Vec::new());
        writer.write(&mut out, true).expect("exif");
        Bytes::from(out.into_inner())
    }

    fn orientation_of(exif: Option<Bytes>) -> Option<(u32, usize)> {
        let read = exif::Reader::new().read_raw(exif?.to_vec()).ok()?;
        let o = read
            .get_field(Tag::Orientation, In::PRIMARY)?
            .value
            .get_uint(0)?;
        Some((o, read.fields().count()))
    }

    #[test]
    fn a_photos_orientation_stays_alone_and_the_rest_of_its_exif_goes() {
        let photo = Bytes::from_static(include_bytes!("../tests/fixtures/photo.jpg"));
        let mut jpeg = img_parts::jpeg::Jpeg::from_bytes(photo.clone()).expect("jpeg");
        jpeg.set_exif(Some(camera_exif(6)));
        let stored = strip_metadata(jpeg.encoder().bytes(), "jpg").expect("a jpeg");
        assert!(!stored.windows(5).any(|w| w == b"Phone"), "the camera went");
        let exif = img_parts::jpeg::Jpeg::from_bytes(stored)
            .expect("jpeg")
            .exif();
        assert_eq!(
            orientation_of(exif),
            Some((6, 1)),
            "only the orientation stays"
        );

        let png = Bytes::from_static(include_bytes!("../tests/fixtures/photo.png"));
        let mut png = img_parts::png::Png::from_bytes(png).expect("png");
        png.set_exif(Some(camera_exif(8)));
        let stored = strip_metadata(png.encoder().bytes(), "png").expect("a png");
        let exif = img_parts::png::Png::from_bytes(stored).expect("png").exif();
        assert_eq!(orientation_of(exif), Some((8, 1)));

        // Upright (the default): no EXIF block at all.
        let mut jpeg = img_parts::jpeg::Jpeg::from_bytes(photo).expect("jpeg");
        jpeg.set_exif(Some(camera_exif(1)));
        let stored = strip_metadata(jpeg.encoder().bytes(), "jpg").expect("a jpeg");
        assert!(
            img_parts::jpeg::Jpeg::from_bytes(stored)
                .expect("jpeg")
                .exif()
                .is_none()
        );
    }
}
