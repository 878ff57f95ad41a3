//! Speculative decoding's flags, named as llama-server's where they mean the same:
//! `--spec-type` picks where drafts come from (off by default), `--spec-draft-n-max` and
//! `--spec-draft-n-min` bound a draft's length. Our `ngram` type is prompt lookup
//! (`engine/draft.rs`); llama-server's `ngram-simple` and `ngram-mod` spellings are taken as it,
//! so a llama-server command line keeps working.

use radix_serve::engine::draft::{SpecConfig, SpecType};

/// Where drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SpecTypeArg {
    /// No speculative decoding.
    #[default]
    None,
    /// Prompt lookup: the continuation of the longest earlier match of the sequence's end in
    /// its prompt and output.
    #[value(alias = "ngram-simple", alias = "ngram-mod")]
    Ngram,
}

/// The speculative-decoding flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SpecArgs {
    /// Speculative decoding: draft tokens ahead and verify them in one forward pass; the
    /// output is the same as without (greedy and seeded sampling alike), only faster when
    /// drafts are accepted. `ngram` drafts by prompt lookup (edits and quotes of the context).
    #[arg(long = "spec-type", value_enum, default_value_t = SpecTypeArg::None)]
    spec_type: SpecTypeArg,
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
        let spec_type = match self.spec_type {
            SpecTypeArg::None => SpecType::None,
            SpecTypeArg::Ngram => SpecType::Ngram,
        };
        let defaults = SpecConfig::default();
        Ok(SpecConfig {
            spec_type,
            draft_max: self.draft_max,
            draft_min: self.draft_min,
            ngram_min: self.ngram_min,
            ngram_max: defaults.ngram_max.max(self.ngram_min),
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
        let error = parse(&["--spec-type", "draft-mtp"]).unwrap_err();
        assert!(error.contains("draft-mtp") && error.contains("ngram"), "{error}");
        let error = parse(&["--spec-type", "ngram", "--spec-draft-n-min", "9", "--spec-draft-n-max", "4"]).unwrap_err();
        assert!(error.contains("--spec-draft-n-min"), "{error}");
        assert!(parse(&["--spec-ngram-n-match", "0"]).unwrap_err().contains("at least 1"));
    }
}
