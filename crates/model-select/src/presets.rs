//! The shipped detectors (`preset: default`): prototypes of all-MiniLM-L6-v2
//! embeddings of public data from pinned PyPI wheels (`tools/presets/build_data.py`,
//! trained by `sgl-router-bench train-presets`), committed beside this crate
//! (`presets/*.json`, each vector in int8 with its scale, hex) and read once.
//! A config that names a preset is checked against the model it was trained on
//! (the embedding of a probe text).

use std::sync::OnceLock;

use serde::Deserialize;

/// The text whose vector tells the presets' model from another.
pub const PROBE_TEXT: &str = "The quick brown fox jumps over the lazy dog.";
/// The presets there are.
pub const PRESETS: [&str; 1] = ["default"];
/// The least cosine the running model's probe vector must have to the presets' one (int8
/// against f32 is above 0.997).
pub(crate) const SAME_MODEL: f64 = 0.98;

/// The jailbreak detector's prototypes and threshold.
#[derive(Debug)]
pub struct JailbreakPreset {
    /// The model it was trained on.
    pub model: String,
    probe: Vec<f32>,
    /// The score (the mean similarity of the `k` nearest malicious prototypes minus that of
    /// the `k` nearest benign ones) at which 1 % of held-out ordinary texts matched.
    pub threshold: f64,
    /// Prototypes on each side the score averages.
    pub k: usize,
    /// Attack prototypes.
    pub malicious: Vec<Vec<f32>>,
    /// Benign prototypes.
    pub benign: Vec<Vec<f32>>,
}

/// The domain classifier's labels and their prototypes.
#[derive(Debug)]
pub struct DomainPreset {
    /// The model it was trained on.
    pub model: String,
    probe: Vec<f32>,
    /// Each label's prototypes.
    pub labels: Vec<(String, Vec<Vec<f32>>)>,
}

#[derive(Deserialize)]
struct JailbreakFile {
    model: String,
    probe: String,
    threshold: f64,
    k: usize,
    malicious: Vec<String>,
    benign: Vec<String>,
}

#[derive(Deserialize)]
struct DomainFile {
    model: String,
    probe: String,
    labels: Vec<LabelFile>,
}

#[derive(Deserialize)]
struct LabelFile {
    name: String,
    prototypes: Vec<String>,
}

fn vectors(list: &[String]) -> Vec<Vec<f32>> {
    list.iter().filter_map(|s| decode_vector(s)).collect()
}

impl JailbreakPreset {
    /// The model's vector of [`PROBE_TEXT`].
    pub(crate) fn probe(&self) -> &[f32] {
        &self.probe
    }
}

impl DomainPreset {
    /// The model's vector of [`PROBE_TEXT`].
    pub(crate) fn probe(&self) -> &[f32] {
        &self.probe
    }
}

/// The shipped jailbreak detector.
pub fn jailbreak() -> &'static JailbreakPreset {
    static PRESET: OnceLock<JailbreakPreset> = OnceLock::new();
    PRESET.get_or_init(|| {
        let f: JailbreakFile =
            serde_json::from_str(include_str!("../presets/jailbreak.json")).expect("presets/jailbreak.json parses");
        JailbreakPreset {
            model: f.model,
            probe: decode_vector(&f.probe).unwrap_or_default(),
            threshold: f.threshold,
            k: f.k,
            malicious: vectors(&f.malicious),
            benign: vectors(&f.benign),
        }
    })
}

/// The shipped domain classifier.
pub fn domain() -> &'static DomainPreset {
    static PRESET: OnceLock<DomainPreset> = OnceLock::new();
    PRESET.get_or_init(|| {
        let f: DomainFile =
            serde_json::from_str(include_str!("../presets/domain.json")).expect("presets/domain.json parses");
        DomainPreset {
            model: f.model,
            probe: decode_vector(&f.probe).unwrap_or_default(),
            labels: f.labels.into_iter().map(|l| (l.name, vectors(&l.prototypes))).collect(),
        }
    })
}

/// `v` in int8 with its scale: the scale's f32 bits then each value, in hex.
pub fn encode_vector(v: &[f32]) -> String {
    let scale = v.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
    let mut out = format!("{:08x}", scale.to_bits());
    for x in v {
        let q = if scale > 0.0 { (x / scale).round().clamp(-127.0, 127.0) as i8 } else { 0 };
        out.push_str(&format!("{:02x}", q as u8));
    }
    out
}

/// A vector [`encode_vector`] wrote, made unit length again.
pub fn decode_vector(s: &str) -> Option<Vec<f32>> {
    let byte = |i: usize| u8::from_str_radix(s.get(i..i + 2)?, 16).ok();
    let scale = f32::from_bits(u32::from_str_radix(s.get(..8)?, 16).ok()?);
    let v: Vec<f32> =
        (8..s.len()).step_by(2).map(|i| byte(i).map(|b| f32::from(b as i8) * scale)).collect::<Option<_>>()?;
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    (norm > 0.0).then(|| v.iter().map(|x| x / norm).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(x, y)| f64::from(x * y)).sum()
    }

    #[test]
    fn vectors_survive_their_int8_form() {
        let v: Vec<f32> = (0..384).map(|i| ((i * 37 % 101) as f32 - 50.0) / 400.0).collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let unit: Vec<f32> = v.iter().map(|x| x / norm).collect();
        let back = decode_vector(&encode_vector(&unit)).unwrap();
        assert!(cosine(&unit, &back) > 0.9999, "{}", cosine(&unit, &back));
        assert_eq!(decode_vector("zz"), None);
    }

    #[test]
    fn the_committed_presets_parse_with_every_vector() {
        let j = jailbreak();
        assert_eq!(j.model, "all-MiniLM-L6-v2");
        assert!(j.malicious.len() >= 16 && j.benign.len() >= 16);
        assert!(j.malicious.iter().chain(&j.benign).chain([&j.probe]).all(|v| v.len() == 384));
        assert!((-1.0..1.0).contains(&j.threshold));
        let d = domain();
        let names: Vec<&str> = d.labels.iter().map(|(n, _)| n.as_str()).collect();
        for label in ["math", "coding", "reasoning", "writing", "extraction", "stem", "humanities", "other"] {
            assert!(names.contains(&label), "{names:?}");
        }
        assert!(d.labels.iter().all(|(_, p)| !p.is_empty() && p.iter().all(|v| v.len() == 384)));
    }
}
