use super::*;

/// No bound on one caller's rate or weight: these tests send everything as one caller.
fn learning(max_routes: usize) -> Learning {
    let unbounded = FeedbackConfig { per_caller_per_minute: 0, caller_weight: 0, ..FeedbackConfig::default() };
    Learning::new(FeedbackConfig { max_routes, ..unbounded }).unwrap()
}

fn verdict(l: &Learning, id: u64, v: &str) -> Result<Value, GatewayError> {
    l.feedback(json!({"route_id": format_id(id), "verdict": v}).to_string().as_bytes())
}

#[test]
fn a_route_is_judged_once_and_moves_its_arm() {
    let l = learning(10);
    let id = l.issue("hard", "large", Some(0.8));
    let out = verdict(&l, id, "bad").unwrap();
    let close = |v: &Value, x: f64| (v.as_f64().unwrap() - x).abs() < 1e-9;
    assert!(close(&out["arm"]["alpha"], 9.0), "prior 1 + 0.8 x 10, no good verdict: {out}");
    assert!(close(&out["arm"]["beta"], 4.0), "prior 1 + 0.2 x 10, one bad verdict: {out}");
    assert!(matches!(verdict(&l, id, "good"), Err(GatewayError::Unprocessable(_))), "judged once");
    assert!(matches!(verdict(&l, id ^ 1, "good"), Err(GatewayError::NotFound(_))));
    for bad in [&b"{"[..], br#"{"route_id": "x"}"#, br#"{"route_id": "x", "verdict": "meh"}"#, br#"{"extra": 1}"#] {
        assert!(matches!(l.feedback(bad), Err(GatewayError::BadRequest(_))), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn route_ids_are_bounded_and_expire() {
    let l = learning(3);
    let ids: Vec<u64> = (0..5).map(|_| l.issue("d", "p", None)).collect();
    assert_eq!(l.routes_held(), 3);
    assert!(matches!(verdict(&l, ids[0], "good"), Err(GatewayError::NotFound(_))), "pushed out");
    assert!(verdict(&l, ids[4], "good").is_ok());
    let short = Learning::new(FeedbackConfig { ttl: Duration::ZERO, ..FeedbackConfig::default() }).unwrap();
    let id = short.issue("d", "p", None);
    std::thread::sleep(Duration::from_millis(2));
    assert!(matches!(verdict(&short, id, "good"), Err(GatewayError::NotFound(_))), "expired");
    short.issue("d", "p", None);
    assert_eq!(short.routes_held(), 1, "the expired one made room");
}

#[test]
fn a_forgotten_route_id_takes_no_room() {
    let l = learning(2);
    let (a, b) = (l.issue("d", "p", None), l.issue("d", "p", None));
    l.forget(b);
    assert_eq!(l.routes_held(), 1);
    assert!(matches!(verdict(&l, b, "good"), Err(GatewayError::NotFound(_))), "forgotten");
    l.issue("d", "p", None);
    assert!(verdict(&l, a, "good").is_ok(), "not pushed out: the forgotten one made room");
    l.forget(a ^ 1); // unknown: ignored
    assert_eq!(l.routes_held(), 2);
    // A forgotten oldest id holds back no expiry behind it.
    let ttl = Duration::from_millis(200);
    let short = Learning::new(FeedbackConfig { ttl, ..FeedbackConfig::default() }).unwrap();
    let first = short.issue("d", "p", None);
    short.issue("d", "p", None);
    short.forget(first);
    std::thread::sleep(ttl + Duration::from_millis(10));
    short.issue("d", "p", None);
    assert_eq!(short.routes_held(), 1, "the expired one behind the forgotten one made room");
}

#[test]
fn a_preference_needs_two_pools_of_one_decision() {
    let l = learning(10);
    let (a, b, c) = (l.issue("d", "small", None), l.issue("d", "large", None), l.issue("e", "large", None));
    let pref =
        |w: u64, lo: u64| l.feedback(json!({"winner": format_id(w), "loser": format_id(lo)}).to_string().as_bytes());
    assert!(matches!(pref(a, c), Err(GatewayError::Unprocessable(_))), "two decisions");
    assert!(matches!(pref(a, a), Err(GatewayError::Unprocessable(_))), "one answer");
    let out = pref(b, a).unwrap();
    assert!(out["winner"]["arm"]["elo"].as_f64().unwrap() > model_select::ELO_START, "{out}");
    assert!(matches!(pref(b, a), Err(GatewayError::Unprocessable(_))), "both judged");
    assert!(verdict(&l, c, "good").is_ok(), "a refused pair marked nothing");
}

#[test]
fn the_state_file_round_trips_and_a_bad_one_stops_the_start() {
    let dir = std::env::temp_dir().join(format!("sgl-feedback-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.json");
    let _ = std::fs::remove_file(&path);
    let config = FeedbackConfig { state_file: Some(path.clone()), ..FeedbackConfig::default() };
    let l = Learning::new(config.clone()).unwrap();
    assert!(!l.save().unwrap(), "nothing changed: nothing written");
    let id = l.issue("d", "p", None);
    verdict(&l, id, "good").unwrap();
    assert!(l.save().unwrap());
    let again = Learning::new(config.clone()).unwrap();
    assert_eq!(again.snapshot(), l.snapshot());
    assert_eq!(again.arms_held(), 1);
    std::fs::write(&path, b"{not json").unwrap();
    assert!(Learning::new(config).unwrap_err().contains("not a feedback state file"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_bandit_moves_to_the_pool_feedback_favours() {
    let l = learning(10_000);
    let candidates = [("small", Some(0.5)), ("large", Some(0.5))];
    for _ in 0..200 {
        let (chosen, _) = l.choose("d", &candidates, &model_select::Bandit::default());
        let pool = candidates[chosen.unwrap()].0;
        let id = l.issue("d", pool, Some(0.5));
        verdict(&l, id, if pool == "large" { "good" } else { "bad" }).unwrap();
    }
    let large = (0..1000).filter(|_| l.choose("d", &candidates, &model_select::Bandit::default()).0 == Some(1)).count();
    assert!(large > 950, "{large} of 1000 to the pool with good verdicts");
}

#[test]
fn only_the_caller_who_got_an_answer_judges_it() {
    let l = Learning::new(FeedbackConfig::default()).unwrap();
    let (a, b) = (Some([1u8; 32]), Some([2u8; 32]));
    let id = l.issue_for("d", "p", None, a);
    let body = json!({"route_id": format_id(id), "verdict": "good"}).to_string();
    assert!(matches!(l.feedback_from(body.as_bytes(), b), Err(GatewayError::NotFound(_))), "another tenant");
    assert!(matches!(l.feedback_from(body.as_bytes(), None), Err(GatewayError::NotFound(_))), "anonymous");
    assert!(l.feedback_from(body.as_bytes(), a).is_ok(), "its own caller");
    let (x, y) = (l.issue_for("d", "small", None, a), l.issue_for("d", "large", None, b));
    let pair = json!({"winner": format_id(x), "loser": format_id(y)}).to_string();
    assert!(matches!(l.feedback_from(pair.as_bytes(), a), Err(GatewayError::NotFound(_))), "half another's");
}

#[test]
fn one_callers_weight_in_an_arm_and_its_rate_are_bounded() {
    let config = FeedbackConfig { caller_weight: 5, per_caller_per_minute: 0, ..FeedbackConfig::default() };
    let l = Learning::new(config).unwrap();
    let (attacker, tenant) = (Some([1u8; 32]), Some([2u8; 32]));
    let say = |caller, pool: &str| {
        let id = l.issue_for("d", pool, None, caller);
        l.feedback_from(json!({"route_id": format_id(id), "verdict": "good"}).to_string().as_bytes(), caller)
    };
    let moved = (0..50).filter(|_| say(attacker, "large").is_ok()).count();
    assert_eq!(moved, 5, "the attacker's 50 verdicts weigh 5");
    assert_eq!(lock(&l.outcomes).arm("d", "large", None).alpha, 6.0 + 5.0, "prior 1 + 10·0.5, then 5 good");
    assert!(matches!(say(attacker, "large"), Err(GatewayError::FeedbackLimited(_))));
    say(attacker, "small").expect("another arm has its own bound");
    say(tenant, "large").expect("another caller's verdicts still count");
    assert_eq!(l.counts.get("kind=\"verdict\",outcome=\"over_weight\""), 46);
    // A refused verdict leaves the route open: once the bound is lifted it counts.
    let id = l.issue_for("d", "large", None, attacker);
    let body = json!({"route_id": format_id(id), "verdict": "bad"}).to_string();
    assert!(l.feedback_from(body.as_bytes(), attacker).is_err());
    *lock(&l.callers) = Callers::new(Limits { per_minute: 0, weight: 0, max_callers: 1 });
    l.feedback_from(body.as_bytes(), attacker).expect("not judged by the refusal");

    let config = FeedbackConfig { per_caller_per_minute: 3, caller_weight: 0, ..FeedbackConfig::default() };
    let l = Learning::new(config).unwrap();
    for _ in 0..3 {
        assert!(matches!(l.feedback_from(b"{}", attacker), Err(GatewayError::BadRequest(_))));
    }
    let id = l.issue_for("d", "large", None, attacker);
    let body = json!({"route_id": format_id(id), "verdict": "good"}).to_string();
    assert!(matches!(l.feedback_from(body.as_bytes(), attacker), Err(GatewayError::FeedbackLimited(_))));
    let other = l.feedback_from(body.as_bytes(), tenant);
    assert!(matches!(other, Err(GatewayError::NotFound(_))), "not its route, and not rate-limited either");
    assert_eq!(l.callers_held(), 2);
}
