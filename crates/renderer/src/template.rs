//! HF-compatible chat templates on minijinja: the environment transformers
//! builds (`trim_blocks`, `lstrip_blocks`, loop controls, Python string and
//! dict methods, `tojson` as `json.dumps`, `raise_exception`, `strftime_now`,
//! Python printing of values) and the detection of the template's content format.
//!
//! Owns compiling and rendering one template; building its variables from a
//! request is `chat.rs`'s job.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior};

use crate::RenderError;
use crate::pyjson::{self, DumpOptions};
use crate::strftime::strftime_now;

/// Name under which the template is registered in its environment.
const TEMPLATE_NAME: &str = "chat_template";
/// Marks an error raised by the template itself through `raise_exception`.
const RAISED: &str = "raise_exception: ";

/// Whether a template reads message content as a string or as a list of parts.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ContentFormat {
    /// Content is text; text parts of an array are joined with a space.
    String,
    /// Content is kept as a list of `{"type": ..., ...}` parts.
    OpenAi,
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    content_format: ContentFormat,
    /// The source is the built-in ChatML template (`crate::chatml` renders it directly).
    builtin_chatml: bool,
    /// Whether a system message after the first turn renders in place, and renders at all
    /// (probed once).
    inline_system: std::sync::OnceLock<(bool, bool)>,
}

// === impl ChatTemplate ===

impl ChatTemplate {
    /// Compiles `source`; a syntax error names its line.
    pub fn new(source: &str) -> Result<Self, RenderError> {
        let content_format = detect_content_format(source);
        let mut env = Environment::new();
        let mut syntax = minijinja::syntax::SyntaxConfig::builder();
        syntax.trim_blocks(true).lstrip_blocks(true);
        env.set_syntax(syntax.build().map_err(template_error)?);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            let mut text = String::new();
            pyjson::py_str(&mut text, value);
            out.write_str(&text).map_err(Error::from)
        });
        env.add_function("raise_exception", |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, format!("{RAISED}{message}")))
        });
        env.add_function("strftime_now", |format: String| strftime_now(&format));
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source)).map_err(template_error)?;
        let builtin_chatml = source == crate::BUILTIN_CHAT_TEMPLATE;
        Ok(Self { env, content_format, builtin_chatml, inline_system: std::sync::OnceLock::new() })
    }

    /// Whether a `system` message after the first turn renders in place, SGLang's probe
    /// (`detect_inline_system_support`): a second system message's sentinel must appear in the
    /// output of a four-message conversation; a template that raises or drops it does not.
    pub fn supports_inline_system(&self) -> bool {
        self.inline_system_probe().0
    }

    /// Whether a `system` message after the first turn renders without an error, vLLM's probe
    /// (`_detect_merge_inline_system`: it merges such messages only when the template raises).
    pub fn takes_inline_system(&self) -> bool {
        self.inline_system_probe().1
    }

    /// (the second system message shows, the conversation renders at all), probed once.
    fn inline_system_probe(&self) -> (bool, bool) {
        *self.inline_system.get_or_init(|| {
            const SENTINEL: &str = "__sglang_inline_system_sentinel__";
            let ctx = minijinja::context! {
                messages => vec![
                    minijinja::context! { role => "system", content => "t" },
                    minijinja::context! { role => "user", content => "t" },
                    minijinja::context! { role => "system", content => SENTINEL },
                    minijinja::context! { role => "user", content => "t" },
                ],
                add_generation_prompt => false,
            };
            match self.render(ctx) {
                Ok(text) => (text.contains(SENTINEL), true),
                Err(_) => (false, false),
            }
        })
    }

    /// Whether this is the built-in ChatML template.
    pub(crate) fn is_builtin_chatml(&self) -> bool {
        self.builtin_chatml
    }

    /// The content format the template expects (SGLang's detection rule).
    pub fn content_format(&self) -> ContentFormat {
        self.content_format
    }

    /// Renders with `ctx` as the template's variables.
    pub fn render(&self, ctx: Value) -> Result<String, RenderError> {
        let template = self.env.get_template(TEMPLATE_NAME).map_err(template_error)?;
        template.render(ctx).map_err(template_error)
    }
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent.or(kwargs.get::<Option<Value>>("indent")?) {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
        Some(v) => Some(" ".repeat(usize::try_from(v)?)),
    };
    let mut opts = DumpOptions::new(indent);
    if let Some(seps) = kwargs.get::<Option<Value>>("separators")?
        && !seps.is_none()
    {
        let parts: Vec<String> = seps.try_iter()?.map(|p| p.to_string()).collect();
        if let [item, key] = parts.as_slice() {
            opts.item_sep = item.clone();
            opts.key_sep = key.clone();
        } else {
            return Err(Error::new(ErrorKind::InvalidOperation, "separators must be a pair"));
        }
    }
    opts.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    opts.ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let text = pyjson::dumps(value, &opts).map_err(|e| Error::new(ErrorKind::InvalidOperation, e))?;
    Ok(Value::from_safe_string(text))
}

fn template_error(err: Error) -> RenderError {
    let line = err.line().unwrap_or(0);
    // A raise inside a macro or include surfaces wrapped; look through the chain.
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = source {
        if let Some(mj) = e.downcast_ref::<Error>()
            && let Some(message) = mj.detail().and_then(|d| d.strip_prefix(RAISED))
        {
            return RenderError::TemplateRaised { message: message.to_string(), line: mj.line().unwrap_or(line) };
        }
        source = e.source();
    }
    let message = match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    };
    RenderError::Template { message, line }
}

/// transformers' `{% generation %}` block only marks assistant spans for
/// training masks; it renders its body unchanged. minijinja has no such tag,
/// so it becomes `{% if true %}` with the same whitespace control.
fn rewrite_generation_tags(source: &str) -> String {
    if !source.contains("generation") {
        return source.to_string();
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open]);
        let tag = &rest[open..];
        let Some(close) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..close];
        let (lead, body) = split_ws_control(inner, true);
        let (body, trail) = split_ws_control(body, false);
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..close + 2]),
        }
        rest = &tag[close + 2..];
    }
    out.push_str(rest);
    out
}

/// Splits a leading (or trailing) `-`/`+` whitespace-control marker off a tag body.
fn split_ws_control(s: &str, leading: bool) -> (&str, &str) {
    if leading {
        match s.chars().next() {
            Some('-' | '+') => (&s[..1], &s[1..]),
            _ => ("", s),
        }
    } else {
        match s.chars().last() {
            Some('-' | '+') => (&s[..s.len() - 1], &s[s.len() - 1..]),
            _ => (s, ""),
        }
    }
}

/// SGLang's `detect_jinja_template_content_format`: templates that mention
/// media, or loop over `message['content']` (also `msg`/`m`), take content parts.
pub fn detect_content_format(source: &str) -> ContentFormat {
    if ["image", "audio", "video", "vision"].iter().any(|k| source.contains(k)) {
        return ContentFormat::OpenAi;
    }
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        let tag = &rest[open + 2..];
        let close = tag.find("%}").unwrap_or(tag.len());
        let stmt = tag[..close].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        if let Some(after_for) = stmt.strip_prefix("for ")
            && let Some((_, iter)) = after_for.split_once(" in ")
            && iterates_content(iter.trim())
        {
            return ContentFormat::OpenAi;
        }
        rest = &tag[close.min(tag.len())..];
    }
    ContentFormat::String
}

fn iterates_content(iter: &str) -> bool {
    let compact: String = iter.chars().filter(|c| !c.is_whitespace()).collect();
    ["message", "msg", "m"].iter().any(|var| {
        ["['content']", "[\"content\"]", ".content"].iter().any(|access| {
            let pat = format!("{var}{access}");
            compact.starts_with(&pat)
                && compact[pat.len()..].chars().next().is_none_or(|c| !c.is_alphanumeric() && c != '_')
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: serde_json::Value) -> Result<String, RenderError> {
        ChatTemplate::new(src)?.render(Value::from(minijinja::value::Serde(ctx)))
    }

    #[test]
    fn trims_blocks_and_lstrips_like_hf() {
        let src =
            "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}";
        let out = render(src, serde_json::json!({"messages": [{"role": "user", "content": "hi"}]})).unwrap();
        assert_eq!(out, "[hi]\n");
    }

    #[test]
    fn prints_python_values_and_json() {
        let src = "{{ flag }} {{ nothing }} {{ items }} {{ tools | tojson }} {{ 'a b'.split() }} {{ d.get('k', 'x') }}";
        let out = render(
            src,
            serde_json::json!({"flag": true, "nothing": null, "items": [1, "é"], "tools": {"name": "f<", "p": [1.0]}, "d": {}}),
        )
        .unwrap();
        assert_eq!(out, r#"True None [1, 'é'] {"name": "f<", "p": [1.0]} ['a', 'b'] x"#);
    }

    #[test]
    fn raise_exception_is_a_typed_error_with_its_line() {
        let src = "line one\n{% if messages|length == 0 %}{{ raise_exception('need a message') }}{% endif %}";
        match render(src, serde_json::json!({"messages": []})) {
            Err(RenderError::TemplateRaised { message, line }) => {
                assert_eq!(message, "need a message");
                assert_eq!(line, 2);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn syntax_errors_name_the_line() {
        match ChatTemplate::new("ok\n{% if %}") {
            Err(RenderError::Template { line, .. }) => assert_eq!(line, 2),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn loop_controls_and_generation_tags() {
        let src = "{% for i in [1,2,3,4] %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}{%- generation -%} G {%- endgeneration %}";
        assert_eq!(render(src, serde_json::json!({})).unwrap(), "13G");
    }

    #[test]
    fn content_format_detection() {
        assert_eq!(detect_content_format("{{ message['content'] }}"), ContentFormat::String);
        assert_eq!(
            detect_content_format("{%- for content in message['content'] -%}{{ content.text }}{% endfor %}"),
            ContentFormat::OpenAi
        );
        assert_eq!(detect_content_format("{% for c in msg.content %}{% endfor %}"), ContentFormat::OpenAi);
        assert_eq!(detect_content_format("{% for c in message.contents %}{% endfor %}"), ContentFormat::String);
        assert_eq!(detect_content_format("<image>"), ContentFormat::OpenAi);
    }
}
