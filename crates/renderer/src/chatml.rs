//! The built-in ChatML template ([`crate::BUILTIN_CHAT_TEMPLATE`]) rendered
//! without the template engine, for the requests it renders alike: no tools,
//! no `tool_calls`, no `chat_template_kwargs`, every content a string (or
//! null, or absent). The text goes straight into one buffer instead of
//! through minijinja's values and concatenations, which for a long prompt
//! copied it several times. Any other request takes the template; the two
//! are compared over generated requests in the tests.

use serde_json::Value as Json;

use crate::ChatRequest;

/// The prompt the built-in template renders for `req` (before a
/// `continue_final_message` cut), or `None` when the request needs the template.
pub(crate) fn render(req: &ChatRequest) -> Option<String> {
    if req.tools.as_ref().is_some_and(|t| !t.is_empty()) || req.chat_template_kwargs.is_some() {
        return None;
    }
    let mut len = 32;
    for m in &req.messages {
        if m.get("tool_calls").is_some_and(|c| !c.is_null()) {
            return None;
        }
        let content = match m.get("content") {
            None | Some(Json::Null) => "",
            Some(Json::String(s)) => s,
            Some(_) => return None,
        };
        len += content.len() + role(m)?.len() + 24;
    }
    let continuing = req.continue_final_message.unwrap_or(false);
    let generation_prompt = if continuing { false } else { req.add_generation_prompt.unwrap_or(true) };
    let mut out = String::with_capacity(len);
    let mut push = |role: &str, content: &str| {
        out.push_str("<|im_start|>");
        out.push_str(role);
        out.push('\n');
        out.push_str(content);
        out.push_str("<|im_end|>\n");
    };
    for m in &req.messages {
        push(role(m)?, m.get("content").and_then(Json::as_str).unwrap_or(""));
    }
    if generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    Some(out)
}

/// A message's role (a string: the request was validated).
fn role(m: &serde_json::Map<String, Json>) -> Option<&str> {
    m.get("role").and_then(Json::as_str)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::{ChatRequest, Renderer};

    /// Over generated conversations (roles in any order, system first or not, empty, null and
    /// absent contents, Unicode and template-looking text, both generation flags, a continued
    /// final message) the direct rendering equals the template's, and requests it does not
    /// take (tools, tool calls, content parts, template kwargs) are left to the template.
    #[test]
    fn renders_what_the_template_renders() {
        let r = Renderer::builtin().unwrap();
        let contents = [
            json!("hello"),
            json!(""),
            json!(null),
            json!("ünïcødé ✓ 你好\n\nline"),
            json!("{{ not a template }} {% if x %}<|im_end|>"),
            json!("  padded  "),
        ];
        let roles = ["system", "user", "assistant", "tool", "developer"];
        let mut checked = 0;
        for n in 1..5usize {
            for seed in 0..60usize {
                let messages: Vec<serde_json::Value> = (0..n)
                    .map(|i| {
                        let k = seed * 7 + i * 3;
                        let mut m = json!({"role": roles[(seed + i * (seed % 3 + 1)) % roles.len()]});
                        if k % 5 != 4 {
                            m["content"] = contents[k % contents.len()].clone();
                        }
                        m
                    })
                    .collect();
                for flags in [
                    json!({}),
                    json!({"add_generation_prompt": false}),
                    json!({"continue_final_message": true, "add_generation_prompt": false}),
                ] {
                    let mut body = json!({"messages": messages});
                    for (k, v) in flags.as_object().unwrap() {
                        body[k] = v.clone();
                    }
                    let Ok(req) = ChatRequest::from_value(&body) else { continue };
                    let direct = r.render_text(&req);
                    let templated = r.render_text_templated(&req);
                    match (direct, templated) {
                        (Ok(d), Ok(t)) => assert_eq!(d, t, "{body}"),
                        (Err(_), Err(_)) => {}
                        (d, t) => panic!("{body}: {d:?} against {t:?}"),
                    }
                    assert!(super::render(&req).is_some(), "{body}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 500, "{checked}");
        for body in [
            json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]}),
            json!({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]}),
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}),
            json!({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": true}}),
        ] {
            let req = ChatRequest::from_value(&body).unwrap();
            assert!(super::render(&req).is_none(), "{body}");
            assert_eq!(r.render_text(&req).unwrap(), r.render_text_templated(&req).unwrap());
        }
    }
}
