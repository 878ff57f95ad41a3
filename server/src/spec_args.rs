//! Speculative decoding's flags, named as llama-server's where they mean the same:
//! `--spec-type` picks where drafts come from (off by default; a comma-separated list, as
//! llama-server takes it), `--spec-draft-n-max` and `--spec-draft-n-min` bound a draft's
//! length, `--spec-draft-p-min` is the head's greedy threshold. Our `ngram` type is prompt
//! lookup (`engine/draft.rs`); llama-server's `ngram-simple` and `ngram-mod` spellings are taken
//! as it, so a llama-server command line keeps working. `draft-mtp` drafts with the model's
//! multi-token-prediction head (Qwen3.5/3.6 GGUF files with `nextn` layers).

use radix_serve::engine::draft::{SpecConfig, SpecType};

/// Where drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpecTypeArg {
    /// No speculative decoding.
    None,
    /// Prompt lookup: the continuation of the longest earlier match of the sequence's end in
    /// its prompt and output.
    #[value(alias = "ngram-simple", alias = "ngram-mod")]
    Ngram,
    /// The model's multi-token-prediction head (with `ngram`: where prompt lookup finds
    /// nothing).
    #[value(alias = "mtp")]
    DraftMtp,
}

/// The speculative-decoding flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SpecArgs {
    /// Speculative decoding: draft tokens ahead and verify them in one forward pass; the
    /// output is the same as without (greedy and seeded sampling alike), only faster when
    /// drafts are accepted. `ngram` drafts by prompt lookup (edits and quotes of the context),
    /// `draft-mtp` with the model's multi-token-prediction head; `ngram,draft-mtp` both.
    #[arg(long = "spec-type", value_enum, value_delimiter = ',', default_value = "none")]
    spec_type: Vec<SpecTypeArg>,
    /// Most tokens drafted for one verify pass.
    #[arg(long = "spec-draft-n-max", value_name = "N", default_value_t = SpecConfig::default().draft_max)]
    draft_max: usize,
    /// Fewest tokens worth a verify pass: shorter drafts are not verified.
    #[arg(long = "spec-draft-n-min", value_name = "N", default_value_t = SpecConfig::default().draft_min)]
    draft_min: usize,
    /// `ngram`: fewest tokens at the end of the sequence that must match earlier text for a
    /// draft to be made.
    #[arg(long = "spec-ngram-n-match", value_name = "N", default_value_t = SpecConfig::default().ngram_min)]
    ngram_min: usize,
    /// `draft-mtp`: most tokens the head drafts for one verify pass (llama-server's
    /// `--spec-draft-n-max` for `draft-mtp`, whose default is the same).
    #[arg(long = "spec-mtp-n-max", value_name = "N", default_value_t = SpecConfig::default().mtp_max)]
    mtp_max: usize,
    /// `draft-mtp`: the head's draft stops before the first token it gives a probability below
    /// this.
    #[arg(long = "spec-draft-p-min", alias = "draft-p-min", value_name = "P", default_value_t = SpecConfig::default().p_min)]
    p_min: f32,
}

impl SpecArgs {
    /// The engine's settings, or what is wrong with the flags.
    pub fn config(&self) -> Result<SpecConfig, String> {
        if self.ngram_min == 0 {
            return Err("--spec-ngram-n-match must be at least 1".into());
        }
        if self.draft_min > self.draft_max {
            return Err(format!(
                "--spec-draft-n-min ({}) is more than --spec-draft-n-max ({})",
                self.draft_min, self.draft_max
            ));
        }
        if !(0.0..=1.0).contains(&self.p_min) {
            return Err(format!("--spec-draft-p-min must be a probability in [0, 1], not {}", self.p_min));
        }
        let has = |t: SpecTypeArg| self.spec_type.contains(&t);
        if has(SpecTypeArg::None) && self.spec_type.len() > 1 {
            return Err("--spec-type: `none` cannot be listed with other types".into());
        }
        let defaults = SpecConfig::default();
        Ok(SpecConfig {
            spec_type: SpecType::of(has(SpecTypeArg::Ngram), has(SpecTypeArg::DraftMtp)),
            draft_max: self.draft_max,
            draft_min: self.draft_min,
            ngram_min: self.ngram_min,
            ngram_max: defaults.ngram_max.max(self.ngram_min),
            mtp_max: self.mtp_max,
            p_min: self.p_min,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        spec: SpecArgs,
    }

    fn parse(args: &[&str]) -> Result<SpecConfig, String> {
        let cli = Cli::try_parse_from(std::iter::once("radix-serve").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.spec.config()
    }

    #[test]
    fn off_by_default_and_llama_spellings_accepted() {
        assert_eq!(parse(&[]).unwrap().spec_type, SpecType::None);
        for spelling in ["ngram", "ngram-mod", "ngram-simple"] {
            let config = parse(&["--spec-type", spelling, "--spec-draft-n-max", "24"]).unwrap();
            assert_eq!((config.spec_type, config.draft_max), (SpecType::Ngram, 24));
        }
        let error = parse(&["--spec-type", "eagle3"]).unwrap_err();
        assert!(error.contains("draft-mtp") && error.contains("ngram"), "{error}");
        assert_eq!(parse(&["--spec-type", "draft-mtp"]).unwrap().spec_type, SpecType::Mtp);
        let both = parse(&["--spec-type", "ngram-mod,draft-mtp", "--spec-draft-p-min", "0.5"]).unwrap();
        assert_eq!((both.spec_type, both.p_min, both.mtp_max), (SpecType::NgramAndMtp, 0.5, 3));
        assert!(parse(&["--spec-type", "none,ngram"]).unwrap_err().contains("none"));
        assert!(parse(&["--spec-type", "mtp", "--spec-draft-p-min", "2"]).unwrap_err().contains("[0, 1]"));
        let error = parse(&["--spec-type", "ngram", "--spec-draft-n-min", "9", "--spec-draft-n-max", "4"]).unwrap_err();
        assert!(error.contains("--spec-draft-n-min"), "{error}");
        assert!(parse(&["--spec-ngram-n-match", "0"]).unwrap_err().contains("at least 1"));
    }
}
