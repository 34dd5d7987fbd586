//! Every role and field of a chat, a completion's prompt and suffix,
//! tool-call arguments kept valid JSON, and encoded values replaced whole.

use serde_json::json;

use super::*;

#[test]
fn redaction_numbers_values_per_type_and_keeps_one_placeholder_per_value() {
    let mut body = json!({"messages": [
        {"role": "system", "content": "Operator: ops@corp.example"},
        {"role": "user", "content": "mail a@b.io or ops@corp.example, call +1 415 555 0100; a@b.io again"},
        {"role": "user", "content": [{"type": "text", "text": "card 4111 1111 1111 1111"}]}
    ]});
    let d = PiiDetector::new();
    let r = redact(&mut body, &d, &[PiiType::Email, PiiType::Phone]);
    assert_eq!(body["messages"][0]["content"], "Operator: [EMAIL_1]");
    assert_eq!(body["messages"][1]["content"], "mail [EMAIL_2] or [EMAIL_1], call [PHONE_1]; [EMAIL_2] again");
    // Not asked for: left alone.
    assert_eq!(body["messages"][2]["content"][0]["text"], "card 4111 1111 1111 1111");
    assert_eq!(r.counts, [(PiiType::Email, 4), (PiiType::Phone, 1)]);
    assert_eq!(r.total(), 5);
    let mut prompt = json!({"prompt": "ssn 078-05-1120"});
    assert_eq!(redact(&mut prompt, &d, &PiiType::ALL).total(), 1);
    assert_eq!(prompt["prompt"], "ssn [US_SSN_1]");
}

fn all(body: &mut serde_json::Value) -> Redactions {
    redact(body, &PiiDetector::new(), &PiiType::ALL)
}

#[test]
fn every_role_and_every_text_field_of_a_chat_is_redacted() {
    let mut body = json!({"messages": [
        {"role": "system", "content": "Escalate to ops@corp.example"},
        {"role": "developer", "content": [{"type": "text", "text": "Key sk-proj-aB3aB3aB3aB3aB3aB3aB3aB3"}]},
        {"role": "user", "name": "jane@example.com", "content": [
            {"type": "text", "text": "I am jane@example.com"},
            {"type": "image_url", "image_url": {"url": "https://x.example/a.png"}},
            {"type": "text", "text": "card 4111 1111 1111 1111"}
        ]},
        {"role": "assistant", "content": null, "refusal": "not for 078-05-1120",
         "reasoning_content": "the user is jane@example.com",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "send_mail", "arguments": "{\"to\":\"bob@example.org\",\"cc\":[\"jane@example.com\"]}"}}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "call +1 415 555 0100"}],
         "function_call": {"name": "lookup", "arguments": "{\"ip\": \"192.168.1.10\"}"}},
        {"role": "tool", "tool_call_id": "c1", "content": "sent to bob@example.org"}
    ]});
    let r = all(&mut body);
    let m = &body["messages"];
    assert_eq!(m[0]["content"], "Escalate to [EMAIL_1]");
    assert_eq!(m[1]["content"][0]["text"], "Key [API_KEY_1]");
    assert_eq!(m[2]["name"], "[EMAIL_2]");
    assert_eq!(m[2]["content"][0]["text"], "I am [EMAIL_2]");
    assert_eq!(m[2]["content"][1]["image_url"]["url"], "https://x.example/a.png");
    assert_eq!(m[2]["content"][2]["text"], "card [CREDIT_CARD_1]");
    assert_eq!(m[3]["refusal"], "not for [US_SSN_1]");
    assert_eq!(m[3]["reasoning_content"], "the user is [EMAIL_2]");
    assert_eq!(m[3]["tool_calls"][0]["function"]["arguments"], r#"{"to":"[EMAIL_3]","cc":["[EMAIL_2]"]}"#);
    assert_eq!(m[3]["tool_calls"][0]["function"]["name"], "send_mail");
    assert_eq!(m[4]["content"][0]["refusal"], "call [PHONE_1]");
    assert_eq!(m[4]["function_call"]["arguments"], r#"{"ip":"[IP_ADDRESS_1]"}"#);
    assert_eq!(m[5]["content"], "sent to [EMAIL_3]");
    assert_eq!(r.total(), 12);
}

/// The PII signals read what `pii_redact` rewrites (`crate::guard_text`), field for field: every
/// value redacted in the chat above is in the signals' text before, and none after.
#[test]
fn the_signals_read_every_field_redaction_rewrites() {
    let mut body = json!({"messages": [
        {"role": "system", "content": "Escalate to ops@corp.example"},
        {"role": "developer", "content": [{"type": "text", "text": "Key sk-proj-aB3aB3aB3aB3aB3aB3aB3aB3"}]},
        {"role": "user", "name": "jane@example.com", "content": [{"type": "text", "text": "card 4111 1111 1111 1111"}]},
        {"role": "assistant", "content": null, "refusal": "not for 078-05-1120",
         "reasoning_content": "the user is jo@example.com",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "send_mail", "arguments": "{\"to\":\"bob@example.org\"}"}}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "call +1 415 555 0100"}],
         "function_call": {"name": "lookup", "arguments": "{\"ip\": \"192.168.1.10\"}"}},
        {"role": "tool", "tool_call_id": "c1", "content": "sent to al@example.net"}
    ]});
    let values = [
        "ops@corp.example",
        "sk-proj-aB3aB3aB3aB3aB3aB3aB3aB3",
        "jane@example.com",
        "4111 1111 1111 1111",
        "078-05-1120",
        "jo@example.com",
        "bob@example.org",
        "+1 415 555 0100",
        "192.168.1.10",
        "al@example.net",
    ];
    let before = crate::guard_text(&body);
    for v in values {
        assert!(before.contains(v), "{v} is read by the signals: {before}");
    }
    assert_eq!(all(&mut body).total(), values.len());
    let after = crate::guard_text(&body);
    for v in values {
        assert!(!after.contains(v), "{v} is redacted: {after}");
    }
}

#[test]
fn tool_call_arguments_stay_json_and_their_escapes_are_read() {
    let arguments = r#"{"to": "jane\u0040example.com", "card": 4111111111111111, "n": 3, "ok": true, "nested": {"tel": "+1 415 555 0100"}}"#;
    let mut body = json!({"messages": [
        {"role": "assistant", "tool_calls": [
            {"id": "a", "function": {"name": "f", "arguments": arguments}},
            {"id": "b", "function": {"name": "g", "arguments": "not json: mail jane@example.com"}},
            {"id": "c", "function": {"name": "h", "arguments": {"to": "jane@example.com"}}},
            {"id": "d", "function": {"name": "i", "arguments": "{\"n\": 1}"}}
        ]}
    ]});
    assert_eq!(all(&mut body).total(), 5);
    let calls = &body["messages"][0]["tool_calls"];
    let parsed: serde_json::Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        parsed,
        json!({"to": "[EMAIL_1]", "card": "[CREDIT_CARD_1]", "n": 3, "ok": true, "nested": {"tel": "[PHONE_1]"}})
    );
    assert_eq!(calls[1]["function"]["arguments"], "not json: mail [EMAIL_1]");
    assert_eq!(calls[2]["function"]["arguments"], json!({"to": "[EMAIL_1]"}));
    // Nothing found: the arguments are not rewritten (not even their spacing).
    assert_eq!(calls[3]["function"]["arguments"], "{\"n\": 1}");
}

#[test]
fn a_completions_prompt_strings_and_suffix_are_redacted() {
    let mut body = json!({"prompt": "mail jane@example.com", "suffix": "or call +1 415 555 0100"});
    assert_eq!(all(&mut body).total(), 2);
    assert_eq!(body, json!({"prompt": "mail [EMAIL_1]", "suffix": "or call [PHONE_1]"}));
    let mut batch = json!({"prompt": ["a jane@example.com", "b jane@example.com", "c 078-05-1120"]});
    assert_eq!(all(&mut batch).total(), 3);
    assert_eq!(batch["prompt"], json!(["a [EMAIL_1]", "b [EMAIL_1]", "c [US_SSN_1]"]));
    let mut ids = json!({"prompt": [1, 2, 3]});
    assert_eq!(all(&mut ids).total(), 0);
    assert_eq!(ids["prompt"], json!([1, 2, 3]));
    let mut generate = json!({"text": "ip 10.0.0.1"});
    assert_eq!(all(&mut generate).total(), 1);
    assert_eq!(generate["text"], "ip [IP_ADDRESS_1]");
}

#[test]
fn encoded_values_are_replaced_whole_and_share_their_placeholder() {
    let mut body = json!({"messages": [{"role": "user", "content":
        "a jane&#64;example.com, b ｊａｎｅ＠ｅｘａｍｐｌｅ．ｃｏｍ, c ja\u{200B}ne@example.com, d jane@example.com; ssn 123–45–6789 end"}]});
    assert_eq!(all(&mut body).total(), 5);
    assert_eq!(
        body["messages"][0]["content"],
        "a [EMAIL_1], b [EMAIL_1], c [EMAIL_1], d [EMAIL_1]; ssn [US_SSN_1] end"
    );
}

#[test]
fn an_anthropic_messages_body_is_redacted_everywhere_its_texts_are() {
    let mut body = json!({
        "system": [{"type": "text", "text": "Escalate to ops@corp.example"}],
        "messages": [
            {"role": "user", "content": "I am jane@example.com"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "mail jane@example.com", "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"email": "jane@example.com", "n": 1}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "phone +1 415 555 0100"}]},
                {"type": "tool_result", "tool_use_id": "t2", "content": "owner ops@corp.example"}
            ]}
        ]
    });
    let guard = crate::request::guard_text(&body);
    for pii in ["ops@corp.example", "jane@example.com", "+1 415 555 0100"] {
        assert!(guard.contains(pii), "signals read {pii} in {guard:?}");
    }
    let r = all(&mut body);
    let text = body.to_string();
    for pii in ["ops@corp.example", "jane@example.com", "415 555 0100"] {
        assert!(!text.contains(pii), "{pii} left in {text}");
    }
    assert_eq!(body["system"][0]["text"], "Escalate to [EMAIL_1]");
    assert_eq!(body["messages"][1]["content"][1]["input"]["email"], "[EMAIL_2]");
    assert_eq!(body["messages"][2]["content"][1]["content"], "owner [EMAIL_1]");
    assert_eq!(r.total(), 6);
}

#[test]
fn answers_of_every_route_are_redacted_and_read() {
    let d = PiiDetector::new();
    let all = crate::selector::redact_types(&[]);
    let mut chat = json!({"choices": [
        {"index": 0, "message": {"role": "assistant", "content": "mail a@example.org", "reasoning_content": "a@example.org is theirs"}},
        {"index": 1, "message": {"role": "assistant", "content": "call +1 415 555 0100"}}]});
    assert_eq!(answer_text(&chat), "a@example.org is theirs\nmail a@example.org\ncall +1 415 555 0100");
    let r = redact_answer(&mut chat, &d, &all);
    assert_eq!(r.counts, [(PiiType::Email, 2), (PiiType::Phone, 1)]);
    assert_eq!(chat["choices"][0]["message"]["content"], "mail [EMAIL_1]");
    assert_eq!(chat["choices"][0]["message"]["reasoning_content"], "[EMAIL_1] is theirs");
    let mut completion = json!({"choices": [{"index": 0, "text": "b@example.org"}]});
    assert_eq!(redact_answer(&mut completion, &d, &all).total(), 1);
    assert_eq!(completion["choices"][0]["text"], "[EMAIL_1]");
    let mut anthropic = json!({"type": "message", "content": [{"type": "text", "text": "c@example.org"}]});
    assert_eq!(answer_text(&anthropic), "c@example.org");
    assert_eq!(redact_answer(&mut anthropic, &d, &all).total(), 1);
    assert_eq!(anthropic["content"][0]["text"], "[EMAIL_1]");
    let mut generated = json!([{"text": "d@example.org", "meta_info": {}}, {"text": "clean"}]);
    assert_eq!(answer_text(&generated), "d@example.org\nclean");
    assert_eq!(redact_answer(&mut generated, &d, &all).total(), 1);
    assert_eq!(generated[0]["text"], "[EMAIL_1]");
}
