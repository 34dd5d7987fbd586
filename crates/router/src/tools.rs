//! The `hash` and `render` tools: read JSON, call the renderer, print JSON.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use renderer::{ChatRequest, HashMode, PageDigest, PageHasher, Renderer, hash::chain_prior};
use router_types::BlockHash;
use serde::Serialize;
use serde_json::Value;

use crate::cli::{HashArgs, HashOptions, RenderArgs};

#[derive(Serialize)]
struct RenderOutput<'a> {
    text: &'a str,
    token_ids: &'a [u32],
    #[serde(skip_serializing_if = "Option::is_none")]
    block_hashes: Option<Vec<i64>>,
}

/// `sgl-router hash`.
pub(crate) fn hash(args: &HashArgs) -> Result<()> {
    let input = read_input(args.tokens_file.as_deref(), "token ids")?;
    let json: Value = serde_json::from_slice(&input).context("token ids are not valid JSON")?;
    let Value::Array(items) = json else { bail!("expected a JSON array of token ids") };
    let tokens = items
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_u64() {
            Some(t) if t <= i64::MAX as u64 => Ok(t),
            _ => bail!("token at position {i} is not an integer in 0..=9223372036854775807: {v}"),
        })
        .collect::<Result<Vec<u64>>>()?;
    let hashes = block_hashes(&tokens, args.page_size, &args.hash)?;
    print_json(&hashes.iter().map(|h| h.0).collect::<Vec<_>>())
}

/// `sgl-router render`.
pub(crate) fn render(args: &RenderArgs) -> Result<()> {
    let renderer = Renderer::from_dir(&args.tokenizer, args.chat_template.as_deref())?;
    let body = read_input(args.request.as_deref(), "request")?;
    let request = ChatRequest::from_json(&body)?;
    let rendered = renderer.render_chat(&request)?;
    let block_hashes = match args.page_size {
        Some(size) => Some(block_hashes(&rendered.token_ids, size, &args.hash)?.into_iter().map(|h| h.0).collect()),
        None => None,
    };
    print_json(&RenderOutput { text: &rendered.text, token_ids: &rendered.token_ids, block_hashes })
}

fn block_hashes<T: renderer::hash::TokenId>(
    tokens: &[T],
    page_size: std::num::NonZeroUsize,
    opts: &HashOptions,
) -> Result<Vec<BlockHash>> {
    let mode = if opts.bigram { HashMode::Bigram } else { HashMode::Unigram };
    let prior: Option<PageDigest> = chain_prior(opts.cache_salt.as_deref());
    Ok(PageHasher::new(page_size, mode).block_hashes(tokens, prior.as_ref())?)
}

fn read_input(path: Option<&Path>, what: &str) -> Result<Vec<u8>> {
    match path {
        Some(p) => std::fs::read(p).with_context(|| format!("cannot read {what} from {}", p.display())),
        None => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).with_context(|| format!("cannot read {what} from stdin"))?;
            Ok(buf)
        }
    }
}

fn print_json<T: Serialize>(value: &T) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}
