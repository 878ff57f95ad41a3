//! Split-system stability: agents send a stable system block and then a dynamic one (cwd, date).
//! Once prepared, two requests that differ only in the dynamic block must render to prompts whose
//! common prefix holds the whole stable block, in text and in Qwen3 tokens, so the radix cache
//! reuses it.

mod common;

use radix_templates::ChatRequest;
use radix_templates::prepare::PreparedTemplate;
use serde_json::{Value as Json, json};
use tokenizers::Tokenizer;

fn with_dynamic_block(request: &ChatRequest, dynamic: &str) -> ChatRequest {
    let mut request = request.clone();
    let last_leading_system =
        request.messages.iter().take_while(|m| m["role"] == "system").count().checked_sub(1).expect("a system message");
    assert!(last_leading_system >= 1, "fixture must have at least two leading system messages");
    request.messages[last_leading_system]["content"] = json!(dynamic);
    request
}

fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn stable_system_block_stays_a_shared_prefix_for_every_template() {
    let tokenizer = Tokenizer::from_file(common::asset_path("qwen3").join("tokenizer.json")).expect("qwen3 tokenizer");
    let conversations = common::conversations();
    let fixtures: Vec<&ChatRequest> = conversations
        .iter()
        .filter(|(name, _)| name.contains("two_system") || name.contains("three_system"))
        .map(|(_, r)| r)
        .collect();
    assert!(fixtures.len() >= 2, "the split-system fixtures are present");
    let mut checked = 0;
    for case in common::templates() {
        let prepared = PreparedTemplate::new(case.template.clone());
        for fixture in &fixtures {
            let first_block = fixture.messages[0]["content"].as_str().expect("string system content").to_owned();
            let a = with_dynamic_block(fixture, "Working directory: /home/dev/alpha\nToday's date: 2025-03-14");
            let b = with_dynamic_block(fixture, "Working directory: /srv/beta\nToday's date: 2026-11-29\nBranch: main");
            let (Ok(text_a), Ok(text_b)) = (prepared.render(&a), prepared.render(&b)) else {
                panic!("{}: prepared split-system requests must render", case.id);
            };
            let start = text_a.find(&first_block).unwrap_or_else(|| panic!("{}: stable block not in prompt", case.id));
            let end = start + first_block.len();
            let shared = common_prefix_len(text_a.as_bytes(), text_b.as_bytes());
            assert!(
                shared >= end,
                "{}: common prefix {shared} bytes ends inside the stable block (ends at {end})",
                case.id
            );

            let tokens_a = tokenizer.encode(text_a.as_str(), false).expect("encode");
            let tokens_b = tokenizer.encode(text_b.as_str(), false).expect("encode");
            let block_tokens = tokens_a.get_offsets().iter().take_while(|(s, _)| *s < end).count();
            assert!(block_tokens > 0);
            assert_eq!(
                tokens_a.get_ids()[..block_tokens],
                tokens_b.get_ids()[..block_tokens],
                "{}: the stable block's {block_tokens} tokens differ between the two requests",
                case.id
            );
            checked += 1;
        }
    }
    assert!(checked >= 14, "every template × split-system fixture checked");
}

#[test]
fn later_system_message_is_never_hoisted_to_the_top() {
    let conversations = common::conversations();
    let (_, request) = conversations.iter().find(|(n, _)| n.contains("system_mid_conversation")).expect("fixture");
    let later = request.messages.iter().skip(1).find(|m| m["role"] == "system").expect("a later system message");
    let later_text = later["content"].as_str().unwrap();
    let first_user = request.messages.iter().find(|m| m["role"] == "user").unwrap()["content"].as_str().unwrap();
    for case in common::templates() {
        let prepared = PreparedTemplate::new(case.template.clone());
        let Ok(text) = prepared.render(request) else { continue };
        if let (Some(later_at), Some(user_at)) = (text.find(later_text), text.find(first_user)) {
            assert!(later_at > user_at, "{}: the later system text moved before the first user turn", case.id);
        }
        // The conversation's first turn renders exactly as it would without anything after it:
        // nothing later in the conversation rewrites the prompt's start.
        let first_user_index = request.messages.iter().position(|m| m["role"] == "user").unwrap();
        let head: Json = json!({"messages": request.messages[..=first_user_index]});
        let head = ChatRequest { add_generation_prompt: false, ..ChatRequest::from_json(&head).unwrap() };
        let head_text = prepared.render(&head).expect("the first turn renders");
        let end = head_text.find(first_user).expect("first user text rendered") + first_user.len();
        assert_eq!(&text[..end], &head_text[..end], "{}: the prompt's first turn changed", case.id);
    }
}
