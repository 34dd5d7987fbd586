//! A model directory's tokenizer files as one zip archive, the form gRPC
//! engines hand them over in (`GetTokenizer`, smg-grpc-servicer's
//! `tokenizer_bundle.py`): [`pack`] makes it (the files that servicer
//! selects), [`unpack`] writes one back into a directory, refusing what a
//! hostile archive could do (paths out of the directory, files the renderer
//! never reads, sizes past a bound).

use std::io::{Cursor, Read, Write};
use std::path::Path;

/// The files an archive holds, by exact name (the servicer's `TOKENIZER_FILES`).
pub const FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "tiktoken.model",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
];

/// ... and by suffix (its `TOKENIZER_GLOBS`: `*.tiktoken`, `*.jinja`, `*.model`).
pub const SUFFIXES: &[&str] = &[".tiktoken", ".jinja", ".model"];

/// The most an archive may unpack to, all files together.
pub const MAX_UNPACKED_BYTES: u64 = 1 << 30;

/// The most files an archive may hold.
pub const MAX_FILES: usize = 256;

/// Why an archive could not be made or unpacked.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("the tokenizer archive: {0}")]
    Zip(#[from] zip::result::ZipError),
    #[error("the tokenizer archive: {0}")]
    Io(#[from] std::io::Error),
    #[error("the tokenizer archive: {0}")]
    Refused(String),
}

/// Whether `name` is a file an archive may hold: a plain file name the servicer selects.
pub fn selected(name: &str) -> bool {
    let plain = !name.is_empty() && !name.contains(['/', '\\', '\0']) && name != "." && name != "..";
    plain && (FILES.contains(&name) || SUFFIXES.iter().any(|s| name.len() > s.len() && name.ends_with(s)))
}

/// The tokenizer files of `dir` as a deflated zip archive, in the servicer's order (the exact
/// names, then the others by name). Refused when `dir` has none.
pub fn pack(dir: &Path) -> Result<Vec<u8>, BundleError> {
    let mut names: Vec<String> = FILES.iter().filter(|n| dir.join(n).is_file()).map(|n| (*n).to_owned()).collect();
    let mut others: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| selected(n) && !FILES.contains(&n.as_str()) && dir.join(n).is_file())
        .collect();
    others.sort();
    names.extend(others);
    if names.is_empty() {
        return Err(BundleError::Refused(format!("no tokenizer files in {}", dir.display())));
    }
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated).large_file(false);
    for name in names {
        zip.start_file(name.as_str(), options)?;
        zip.write_all(&std::fs::read(dir.join(&name))?)?;
    }
    Ok(zip.finish()?.into_inner())
}

/// Writes the archive's tokenizer files into `dir` (made if missing) and returns their names.
/// Refused whole, before anything is written, if it holds more than [`MAX_FILES`] entries, a
/// name that is not a plain file name, or more than [`MAX_UNPACKED_BYTES`] in all; entries the
/// servicer would not have selected are skipped. It must hold `tokenizer.json`.
pub fn unpack(archive: &[u8], dir: &Path) -> Result<Vec<String>, BundleError> {
    let mut zip = zip::ZipArchive::new(Cursor::new(archive))?;
    if zip.len() > MAX_FILES {
        return Err(BundleError::Refused(format!("{} entries, more than {MAX_FILES}", zip.len())));
    }
    let mut files = Vec::new();
    let mut total = 0u64;
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i)?;
        if entry.is_dir() {
            continue;
        }
        let name = entry.name()?.into_owned();
        if name.contains(['/', '\\']) || name == ".." || name.is_empty() {
            return Err(BundleError::Refused(format!("an entry named {name:?}")));
        }
        if !selected(&name) {
            continue;
        }
        // The declared size is the archive's word; the bytes read are bounded regardless.
        let room = MAX_UNPACKED_BYTES - total;
        let mut data = Vec::new();
        (&mut entry).take(room + 1).read_to_end(&mut data)?;
        total += data.len() as u64;
        if total > MAX_UNPACKED_BYTES {
            return Err(BundleError::Refused(format!("more than {MAX_UNPACKED_BYTES} bytes unpacked")));
        }
        files.push((name, data));
    }
    if !files.iter().any(|(n, _)| n == "tokenizer.json") {
        return Err(BundleError::Refused("no tokenizer.json".into()));
    }
    std::fs::create_dir_all(dir)?;
    for (name, data) in &files {
        std::fs::write(dir.join(name), data)?;
    }
    Ok(files.into_iter().map(|(n, _)| n).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), crate::builtin_tokenizer_json()).unwrap();
        std::fs::write(dir.path().join("tokenizer_config.json"), r#"{"chat_template": "{{ messages }}"}"#).unwrap();
        std::fs::write(dir.path().join("template.jinja"), "{{ x }}").unwrap();
        std::fs::write(dir.path().join("model.safetensors"), "weights").unwrap();
        dir
    }

    #[test]
    fn an_archive_unpacks_to_the_tokenizer_files_only() {
        let from = model_dir();
        let archive = pack(from.path()).unwrap();
        let to = tempfile::tempdir().unwrap();
        let names = unpack(&archive, to.path()).unwrap();
        assert_eq!(names, ["tokenizer.json", "tokenizer_config.json", "template.jinja"]);
        for n in &names {
            assert_eq!(std::fs::read(to.path().join(n)).unwrap(), std::fs::read(from.path().join(n)).unwrap());
        }
        assert!(!to.path().join("model.safetensors").exists());
    }

    fn archive_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (name, data) in entries {
            zip.start_file(*name, zip::write::SimpleFileOptions::default()).unwrap();
            zip.write_all(data).unwrap();
        }
        zip.finish().unwrap().into_inner()
    }

    #[test]
    fn a_hostile_archive_is_refused_before_anything_is_written() {
        let to = tempfile::tempdir().unwrap();
        for (entries, why) in [
            (vec![("tokenizer.json", &b"{}"[..]), ("../tokenizer.json", b"{}")], "an entry named"),
            (vec![("tokenizer.json", &b"{}"[..]), ("sub/x.jinja", b"{}")], "an entry named"),
            (vec![("tokenizer_config.json", &b"{}"[..])], "no tokenizer.json"),
        ] {
            let err = unpack(&archive_of(&entries), to.path()).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
        assert_eq!(std::fs::read_dir(to.path()).unwrap().count(), 0);
        assert!(unpack(b"not a zip", to.path()).is_err());
        let many: Vec<(String, &[u8])> = (0..=MAX_FILES).map(|i| (format!("f{i}.jinja"), &b""[..])).collect();
        let many: Vec<(&str, &[u8])> = many.iter().map(|(n, d)| (n.as_str(), *d)).collect();
        assert!(unpack(&archive_of(&many), to.path()).unwrap_err().to_string().contains("entries"));
    }

    /// The archive smg-grpc-servicer's own code builds (`tests/fixtures/tokenizer_bundle/make.py`):
    /// unpacked to its model's tokenizer files, which load as a renderer.
    #[test]
    fn the_servicers_archive_unpacks_and_loads() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer_bundle");
        let archive = std::fs::read(fixture.join("servicer.zip")).unwrap();
        let to = tempfile::tempdir().unwrap();
        let mut names = unpack(&archive, to.path()).unwrap();
        names.sort();
        assert_eq!(
            names,
            ["chat_template.jinja", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
        );
        for n in &names {
            let (got, want) = (std::fs::read(to.path().join(n)).unwrap(), std::fs::read(fixture.join("model").join(n)));
            assert_eq!(got, want.unwrap(), "{n}");
        }
        let r = crate::Renderer::from_dir(to.path(), None).unwrap();
        let chat = crate::ChatRequest::from_json(br#"{"messages": [{"role": "user", "content": "hello world"}]}"#);
        let rendered = r.render_chat(&chat.unwrap()).unwrap();
        assert_eq!(rendered.text, "<|im_start|>user hello world<|im_end|><|im_start|>assistant ");
        assert_eq!(rendered.token_ids, [1, 11, 3, 4, 2, 1, 12]); // user, hello, world, ..., assistant
    }

    #[test]
    fn only_the_servicers_files_are_selected() {
        for yes in ["tokenizer.json", "merges.txt", "chat_template.jinja", "o200k.tiktoken", "spm.model"] {
            assert!(selected(yes), "{yes}");
        }
        for no in ["", ".jinja", "model.safetensors", "a/tokenizer.json", "..", "config.yaml"] {
            assert!(!selected(no), "{no}");
        }
    }
}
