//! From a forward pass's logits to what happens to each sequence: the next token (decided on
//! the GPU for plain greedy rows, else read back, masked by a constraint and sampled), its
//! log-probabilities, its text past stop-string matching, and whether the sequence ends here
//! (stop token, stop string, complete grammar, `max_tokens`, context).

use std::sync::Arc;

use radix_models::tokenizer::Tokenizer;

use super::request::{GenerateRequest, TokenLogprobs};
use super::scheduler::Member;
use super::sequence::{Ending, Sequence};
use super::stop::StopText;

/// A forward pass's logits, one row per member that wants them, seen through the two reads the
/// postprocess needs (the tensor type stays with the model).
pub(crate) struct Logits<'a> {
    /// The logits live on a GPU, where an argmax is cheaper than reading a row back.
    pub(crate) on_device: bool,
    /// Every row's argmax.
    pub(crate) argmax: &'a dyn Fn() -> Result<Vec<u32>, String>,
    /// One row, read back to the host.
    pub(crate) row: &'a dyn Fn(usize) -> Result<Vec<f32>, String>,
}

/// A logits row as the model produced it, with how many alternatives the request wants: what
/// log-probabilities are computed from, before masks and penalties change the row.
type RawRow = Option<(Vec<f32>, usize)>;

/// What a step's postprocess decided.
#[derive(Debug, Default)]
pub(crate) struct StepOutcome {
    /// Running indices of the sequences that end here, with how.
    pub(crate) ends: Vec<(usize, Ending)>,
    /// Each member that verified a draft.
    pub(crate) verified: Vec<Verified>,
}

/// How one member's draft fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verified {
    /// Its running index.
    pub(crate) index: usize,
    /// Rows that hold accepted tokens (its last token's and one per accepted draft), whose K/V
    /// and state stand.
    pub(crate) rows: usize,
    /// Tokens drafted.
    pub(crate) drafted: usize,
    /// Of which accepted.
    pub(crate) accepted: usize,
}

/// Turns logits into tokens, events and endings.
#[derive(Debug)]
pub(crate) struct Postprocess {
    tokenizer: Arc<Tokenizer>,
    /// Longest context a sequence may reach.
    max_context: usize,
}

impl Postprocess {
    /// Decodes text with `tokenizer`; sequences end at `max_context` tokens.
    pub(crate) fn new(tokenizer: Arc<Tokenizer>, max_context: usize) -> Self {
        Postprocess { tokenizer, max_context }
    }

    /// Longest context a sequence may reach.
    pub(crate) fn max_context(&self) -> usize {
        self.max_context
    }

    /// The output text of a new request, with its stop strings.
    pub(crate) fn text(&self, request: &GenerateRequest) -> StopText {
        StopText::new(Arc::clone(&self.tokenizer), &request.stop_strings)
    }

    /// Picks the next token of every member that has a logits row, tells its client, and
    /// returns how the step went: the sequences that end here, and how many rows of each
    /// verified draft hold accepted tokens.
    ///
    /// A member with a draft has a row for its last token and one per drafted token. Its rows
    /// are taken in order, each exactly as a decode step's (masked, penalised, sampled from the
    /// sampler's one stream, its token accepted, its text matched against stop strings): while
    /// the token picked equals the draft's next token the next row is valid and is taken too;
    /// the first token that differs, or an ending, closes the round. So the tokens are those
    /// plain decoding would give, sampled ones included, and a rejected draft never reaches the
    /// client.
    pub(crate) fn run(&self, logits: &Logits, members: &[Member], running: &mut [Sequence]) -> StepOutcome {
        // Asked for once, when the first plain greedy row needs it; `None` inside means the
        // device could not answer and rows are read back instead.
        let mut device_argmax: Option<Option<Vec<u32>>> = None;
        let mut outcome = StepOutcome::default();
        let mut first_row = 0;
        for member in members.iter().filter(|m| m.wants_logits) {
            let seq = &mut running[member.index];
            let draft = seq.draft()[..member.drafted].to_vec();
            let (mut rows, mut accepted, mut ending) = (0, 0, None);
            for (row, drafted) in (first_row..).zip(draft.iter().map(Some).chain([None])) {
                rows += 1;
                let token = match self.next_token(seq, logits, row, &mut device_argmax) {
                    Ok((token, raw)) => {
                        let logprobs = raw.map(|(raw, top)| TokenLogprobs::from_logits(&raw, token, top));
                        ending = seq.accept(token, logprobs, self.max_context);
                        token
                    }
                    Err(message) => {
                        ending = Some(Ending::Failed(message));
                        break;
                    }
                };
                if drafted == Some(&token) {
                    accepted += 1;
                }
                if ending.is_some() || drafted != Some(&token) {
                    break;
                }
            }
            first_row += member.drafted + 1;
            if member.drafted > 0 {
                seq.draft_verified(accepted);
                outcome.verified.push(Verified { index: member.index, rows, drafted: member.drafted, accepted });
            }
            if let Some(ending) = ending {
                outcome.ends.push((member.index, ending));
            }
        }
        outcome
    }

    /// The sequence's next token and, when it asked for log-probabilities, the raw logits row
    /// with how many alternatives it wants.
    fn next_token(
        &self,
        seq: &mut Sequence,
        logits: &Logits,
        row: usize,
        device_argmax: &mut Option<Option<Vec<u32>>>,
    ) -> Result<(u32, RawRow), String> {
        // Plain greedy rows of logits on a GPU are decided there: one id comes back instead of
        // the vocabulary.
        if logits.on_device && seq.is_plain_greedy() {
            let ids = device_argmax.get_or_insert_with(|| (logits.argmax)().ok());
            if let Some(&token) = ids.as_ref().and_then(|ids| ids.get(row)) {
                return Ok((token, None));
            }
        }
        let mut logits_row = (logits.row)(row).map_err(|e| format!("cannot read logits: {e}"))?;
        // A broken forward must fail its request, not sample a garbage token from NaN.
        if let Some(bad) = logits_row.iter().find(|l| l.is_nan() || **l == f32::INFINITY) {
            return Err(format!("the model produced a non-finite logit ({bad}) for this sequence"));
        }
        // Logprobs are the model's distribution, before masks and penalties change the row.
        let raw = seq.top_logprobs().map(|top| (logits_row.clone(), top));
        Ok((seq.sample(&mut logits_row)?, raw))
    }
}
