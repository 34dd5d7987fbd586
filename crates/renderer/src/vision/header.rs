//! An encoded image's size and colour mode as Pillow opens it, read from its header alone (no
//! pixel is decoded): PNG, JPEG, GIF and WebP, with the EXIF orientation vLLM applies
//! (`normalize_image`: `ImageOps.exif_transpose`).

/// What vLLM's loader makes of an image, as far as its identifier and placeholders depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageHeader {
    /// Width in pixels as shown (after the EXIF orientation).
    pub width: u32,
    /// Height in pixels as shown.
    pub height: u32,
    /// Pillow opens it as plain RGB without transparency: vLLM's RGB conversion leaves it as it
    /// is, and its identifier hashes the bytes alone (else with the conversion's settings).
    pub plain_rgb: bool,
}

/// The header of `data`, if it is an image the router reads.
pub fn read(data: &[u8]) -> Option<ImageHeader> {
    let (width, height, plain_rgb, orientation) = if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        png(data)?
    } else if data.starts_with(&[0xFF, 0xD8]) {
        jpeg(data)?
    } else if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
        // Pillow opens a GIF as palette or grey: always converted.
        (u16le(data, 6)? as u32, u16le(data, 8)? as u32, false, 1)
    } else if data.len() >= 12 && &data[..4] == b"RIFF" && &data[8..12] == b"WEBP" {
        webp(data)?
    } else {
        return None;
    };
    if width == 0 || height == 0 {
        return None;
    }
    // Orientations 5 to 8 turn the picture a quarter: width and height swap.
    let (width, height) = if (5..=8).contains(&orientation) { (height, width) } else { (width, height) };
    Some(ImageHeader { width, height, plain_rgb })
}

fn u16le(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(d.get(at..at + 2)?.try_into().ok()?))
}

fn u16be(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(d.get(at..at + 2)?.try_into().ok()?))
}

fn u32le(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?))
}

fn u32be(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(d.get(at..at + 4)?.try_into().ok()?))
}

fn u24le(d: &[u8], at: usize) -> Option<u32> {
    let b = d.get(at..at + 3)?;
    Some(u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16)
}

/// PNG: `IHDR`'s size and colour type (2: RGB, at 8 or 16 bits, Pillow's "RGB"), a `tRNS`
/// chunk (transparency), an `eXIf` chunk (orientation), wherever they are.
fn png(d: &[u8]) -> Option<(u32, u32, bool, u16)> {
    if d.get(12..16)? != b"IHDR" {
        return None;
    }
    let (width, height, colour) = (u32be(d, 16)?, u32be(d, 20)?, *d.get(25)?);
    let (mut transparency, mut orientation) = (false, 1);
    let mut at = 8;
    while let Some(len) = u32be(d, at) {
        let kind = d.get(at + 4..at + 8)?;
        let body = d.get(at + 8..(at + 8).checked_add(len as usize)?)?;
        match kind {
            b"tRNS" => transparency = true,
            b"eXIf" => orientation = exif_orientation(body).unwrap_or(1),
            b"IEND" => break,
            _ => {}
        }
        at += 12 + len as usize;
    }
    Some((width, height, colour == 2 && !transparency, orientation))
}

/// JPEG: the frame header's size and components (3: Pillow's "RGB"; 1 grey, 4 CMYK), the
/// `APP1` EXIF orientation; read up to the first scan.
fn jpeg(d: &[u8]) -> Option<(u32, u32, bool, u16)> {
    let mut at = 2;
    let mut orientation = 1;
    loop {
        if *d.get(at)? != 0xFF {
            return None;
        }
        let marker = *d.get(at + 1)?;
        match marker {
            // Fill bytes, and markers without a length.
            0xFF => at += 1,
            0x01 | 0xD0..=0xD7 => at += 2,
            0xD9 | 0xDA => return None,
            _ => {
                let len = u16be(d, at + 2)? as usize;
                let body = d.get(at + 4..at + 2 + len.max(2))?;
                match marker {
                    0xE1 if body.starts_with(b"Exif\0\0") => {
                        orientation = exif_orientation(&body[6..]).unwrap_or(orientation);
                    }
                    0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => {
                        let height = u16be(body, 1)? as u32;
                        let width = u16be(body, 3)? as u32;
                        let components = *body.get(5)?;
                        return Some((width, height, components == 3, orientation));
                    }
                    _ => {}
                }
                at += 2 + len;
            }
        }
    }
}

/// WebP: `VP8 ` (lossy, no alpha), `VP8L` (lossless, its alpha hint) or `VP8X` (the canvas and
/// its alpha flag, an `EXIF` chunk's orientation).
fn webp(d: &[u8]) -> Option<(u32, u32, bool, u16)> {
    let chunk = |at: usize| -> Option<(&[u8], &[u8], usize)> {
        let kind = d.get(at..at + 4)?;
        let len = u32le(d, at + 4)? as usize;
        let body = d.get(at + 8..(at + 8).checked_add(len)?)?;
        Some((kind, body, at + 8 + len + (len & 1)))
    };
    let (kind, body, mut next) = chunk(12)?;
    match kind {
        b"VP8 " => {
            if body.get(3..6)? != [0x9D, 0x01, 0x2A] {
                return None;
            }
            Some((u32::from(u16le(body, 6)? & 0x3FFF), u32::from(u16le(body, 8)? & 0x3FFF), true, 1))
        }
        b"VP8L" => {
            if *body.first()? != 0x2F {
                return None;
            }
            let bits = u32le(body, 1)?;
            Some(((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, bits >> 28 & 1 == 0, 1))
        }
        b"VP8X" => {
            let flags = *body.first()?;
            let (width, height) = (u24le(body, 4)? + 1, u24le(body, 7)? + 1);
            let mut orientation = 1;
            while let Some((kind, body, after)) = chunk(next) {
                if kind == b"EXIF" {
                    orientation = exif_orientation(body.strip_prefix(b"Exif\0\0").unwrap_or(body)).unwrap_or(1);
                    break;
                }
                next = after;
            }
            Some((width, height, flags & 0x10 == 0, orientation))
        }
        _ => None,
    }
}

/// The orientation (tag 0x0112) in a TIFF-structured EXIF block's first directory.
fn exif_orientation(tiff: &[u8]) -> Option<u16> {
    let tiff = tiff.strip_prefix(b"Exif\0\0").unwrap_or(tiff);
    let le = match tiff.get(..4)? {
        b"II*\0" => true,
        b"MM\0*" => false,
        _ => return None,
    };
    let u16_at = |at: usize| if le { u16le(tiff, at) } else { u16be(tiff, at) };
    let u32_at = |at: usize| if le { u32le(tiff, at) } else { u32be(tiff, at) };
    let ifd = u32_at(4)? as usize;
    let entries = u16_at(ifd)? as usize;
    (0..entries.min(512)).find_map(|i| {
        let e = ifd + 2 + 12 * i;
        (u16_at(e)? == 0x0112 && u16_at(e + 2)? == 3).then(|| u16_at(e + 8)).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_and_foreign_bytes_are_not_images() {
        assert_eq!(read(b""), None);
        assert_eq!(read(b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR"), None);
        assert_eq!(read(&[0xFF, 0xD8, 0xFF, 0xC0, 0, 2]), None);
        assert_eq!(read(b"GIF89a\x01"), None);
        assert_eq!(read(b"RIFF\0\0\0\0WEBPVP8 "), None);
        assert_eq!(read(b"BM not read"), None);
        // A length that runs past the end.
        assert_eq!(read(&[0xFF, 0xD8, 0xFF, 0xE1, 0xFF, 0xFF, 0]), None);
    }

    #[test]
    fn exif_orientation_reads_both_byte_orders() {
        let le = [
            b"II*\0".as_slice(),
            &8u32.to_le_bytes(),
            &1u16.to_le_bytes(),
            &[0x12, 0x01, 3, 0, 1, 0, 0, 0, 6, 0, 0, 0],
        ]
        .concat();
        assert_eq!(exif_orientation(&le), Some(6));
        let be = [
            b"MM\0*".as_slice(),
            &8u32.to_be_bytes(),
            &1u16.to_be_bytes(),
            &[0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 8, 0, 0],
        ]
        .concat();
        assert_eq!(exif_orientation(&be), Some(8));
        assert_eq!(exif_orientation(b"II*\0\xff\xff\xff\xff"), None);
    }
}
