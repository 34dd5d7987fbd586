//! Which of Shepherd Model Gateway's `smg launch` options (1.13.0, read from
//! its wheel into `tests/fixtures/smg/launch_options.json` by the generator
//! beside it) this command line knows, and that each one it knows takes its
//! values as `smg` does (a flag stays a flag, one value stays one value), so
//! an `smg` command line parses here as it does there: all 221 spellings,
//! implemented, mapped onto an option of ours, or refused at start with the
//! reason (`smg_only`).

use std::collections::HashMap;

use clap::CommandFactory;
use serde_json::Value;

use super::Cli;

/// Spellings of `smg launch` options this command line knows: every one.
const KNOWN_AT_LEAST: usize = 221;

/// How many values an option of ours takes: (least, most; `None`: no bound).
fn our_arity(arg: &clap::Arg) -> (usize, Option<usize>) {
    let n = arg.get_num_args().expect("built");
    let takes = arg.get_action().takes_values();
    if !takes {
        return (0, Some(0));
    }
    let max = n.max_values();
    (n.min_values(), (max != usize::MAX).then_some(max))
}

#[test]
fn every_smg_launch_option_we_know_stays_known_and_takes_smgs_values() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/smg/launch_options.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(fixture["smg_version"], "1.13.0");
    let mut cmd = Cli::command();
    cmd.build();
    let mut ours: HashMap<String, &clap::Arg> = HashMap::new();
    for arg in cmd.get_arguments() {
        for long in arg.get_long().into_iter().chain(arg.get_all_aliases().into_iter().flatten()) {
            ours.insert(format!("--{long}"), arg);
        }
    }
    let (mut known, mut unknown, mut misparsed) = (0, Vec::new(), Vec::new());
    let options = fixture["options"].as_array().unwrap();
    for option in options {
        for spelling in option["spellings"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()) {
            let Some(arg) = ours.get(spelling) else {
                unknown.push(spelling);
                continue;
            };
            known += 1;
            let (min, max) = our_arity(arg);
            // What an `smg` command line gives the option: nothing, one value, or a list.
            let fits = match &option["arity"] {
                Value::Number(n) if n.as_u64() == Some(0) => max == Some(0),
                Value::Number(n) if n.as_u64() == Some(1) => min <= 1 && max != Some(0),
                Value::String(s) if s == "?" => min == 0,
                Value::String(s) if s == "*" || s == "+" => max.is_none_or(|m| m > 1) && max != Some(0),
                other => panic!("{spelling}: arity {other}"),
            };
            if !fits {
                misparsed.push(format!("{spelling} (smg {}, ours {min}..{max:?})", option["arity"]));
            }
        }
    }
    let total: usize = options.iter().map(|o| o["spellings"].as_array().unwrap().len()).sum();
    assert_eq!(total, 221, "the fixture holds every spelling of smg 1.13.0's launch options");
    eprintln!("smg launch spellings known here: {known} of {total}; not known: {}", unknown.join(" "));
    assert!(misparsed.is_empty(), "known options taking other values than smg's: {misparsed:?}");
    assert!(known >= KNOWN_AT_LEAST, "{known} spellings known, fewer than {KNOWN_AT_LEAST}: {unknown:?}");
}
