//! The most prompt tokens any prefix cache could have reused: for each request, the longest
//! token prefix it shares with any earlier prompt of the workload (at most its length minus one,
//! since the last prompt token must be computed to get logits). A hit ratio is only as good as
//! the workload allows; this is the bound it is judged against.
//!
//! Prompts are rendered and tokenized by the server itself through llama-server's
//! `/apply-template` and `/tokenize` endpoints (radix-serve has both), so the bound uses exactly
//! the server's template and tokenizer. Servers without them get no bound.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value as Json, json};

use super::workload::Workload;

/// Token ids of every request's prompt, rendered and tokenized by the server at `base`
/// (`http://host:port`, without `/v1`).
pub fn tokenize_prompts(base: &str, api_key: Option<&str>, workload: &Workload) -> Result<Vec<Vec<u32>>> {
    let post = |path: &str, body: Json| -> Result<Json> {
        let mut call = ureq::post(&format!("{base}{path}")).timeout(Duration::from_secs(300));
        if let Some(key) = api_key {
            call = call.set("Authorization", &format!("Bearer {key}"));
        }
        call.send_json(body)
            .with_context(|| format!("POST {path}"))?
            .into_json()
            .with_context(|| format!("POST {path}: body"))
    };
    workload
        .requests
        .iter()
        .map(|r| {
            let mut body = json!({"messages": r.messages});
            if !r.tools.is_empty() {
                body["tools"] = Json::Array(r.tools.clone());
            }
            let rendered = post("/apply-template", body)?;
            let Some(prompt) = rendered["prompt"].as_str() else { bail!("/apply-template gave no 'prompt'") };
            let tokens = post("/tokenize", json!({"content": prompt, "add_special": false}))?;
            tokens["tokens"]
                .as_array()
                .context("/tokenize gave no 'tokens'")?
                .iter()
                .map(|t| t.as_u64().map(|t| t as u32).context("/tokenize: a token id is not a number"))
                .collect()
        })
        .collect()
}

/// For each prompt, the reusable prefix bound described in the module docs.
pub fn ideal_cached(prompts: &[Vec<u32>]) -> Vec<usize> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let shared = prompts[..i].iter().map(|q| common_prefix(p, q)).max().unwrap_or(0);
            shared.min(p.len().saturating_sub(1))
        })
        .collect()
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_is_longest_earlier_prefix_minus_the_last_token() {
        let prompts = vec![vec![1, 2, 3], vec![1, 2, 3, 4, 5], vec![1, 2, 9], vec![1, 2, 3, 4, 5], vec![7]];
        assert_eq!(ideal_cached(&prompts), vec![0, 3, 2, 4, 0]);
    }
}
