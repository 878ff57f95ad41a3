//! Expert offload, named as llama-server's flags: `--cpu-moe` keeps every MoE layer's routed
//! experts in host memory, on our CPU kernels, and `--n-cpu-moe N` those of the first N layers;
//! everything else (attention, norms, router, shared expert, the other layers' experts) runs on
//! the GPU. As in llama-server, the flags are accepted whatever the model and device: on the
//! CPU, or for a model without experts, they change nothing and the log says so.

use radix_models::ModelConfig;

/// The expert-offload flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct MoeArgs {
    /// Keep all Mixture of Experts (MoE) weights in host memory and run them on the CPU, the
    /// rest of the model on the GPU (as llama-server's `--cpu-moe`, `-cmoe`). Nothing changes
    /// with `--device cpu`.
    #[arg(long = "cpu-moe")]
    cpu_moe: bool,
    /// Keep the MoE weights of the first N layers in host memory and run them on the CPU (as
    /// llama-server's `--n-cpu-moe`, `-ncmoe`).
    // Negative numbers are taken as the value, so `--n-cpu-moe -1` is refused as a bad N for
    // this flag rather than as an unknown argument `-1`.
    #[arg(long = "n-cpu-moe", value_name = "N", allow_negative_numbers = true)]
    n_cpu_moe: Option<usize>,
}

impl MoeArgs {
    /// Layers `0..n` keep their experts on the CPU (`usize::MAX`: all of them), for
    /// [`radix_models::LoadOptions::cpu_moe_layers`].
    pub fn cpu_moe_layers(&self) -> usize {
        if self.cpu_moe { usize::MAX } else { self.n_cpu_moe.unwrap_or(0) }
    }

    /// What the flags did, for the log; `None` when none was given.
    pub fn note(&self, on_cpu: bool, config: &ModelConfig) -> Option<String> {
        let layers = self.cpu_moe_layers();
        if layers == 0 {
            return None;
        }
        let flag = if self.cpu_moe { "--cpu-moe".to_owned() } else { format!("--n-cpu-moe {layers}") };
        let sparse = config.moe.as_ref().map(|m| m.sparse_layers.as_slice()).unwrap_or_default();
        let total = sparse.iter().filter(|&&s| s).count();
        let moved = sparse.iter().take(layers).filter(|&&s| s).count();
        Some(if on_cpu {
            format!("{flag}: the model runs on the CPU, where its experts are already; nothing to move")
        } else if total == 0 {
            format!("{flag}: the model has no MoE layers; nothing to move")
        } else {
            format!(
                "{flag}: the routed experts of {moved} of {total} MoE layers stay in host memory on the CPU \
                 kernels; the rest of the model runs on the GPU"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        moe: MoeArgs,
    }

    fn parse(args: &[&str]) -> Result<MoeArgs, clap::Error> {
        let args = crate::normalize_args(std::iter::once("radix-serve").chain(args.iter().copied()).map(String::from));
        Cli::try_parse_from(args).map(|c| c.moe)
    }

    fn config(moe: bool) -> ModelConfig {
        let experts =
            if moe { r#", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16"# } else { "" };
        ModelConfig::from_hf_json(&format!(
            r#"{{"model_type": "{}", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96, "vocab_size": 32,
                "rms_norm_eps": 1e-6{experts}}}"#,
            if moe { "qwen3_moe" } else { "qwen3" }
        ))
        .unwrap()
    }

    #[test]
    fn llama_server_spellings_parse() {
        assert_eq!(parse(&[]).unwrap().cpu_moe_layers(), 0);
        assert_eq!(parse(&["--cpu-moe"]).unwrap().cpu_moe_layers(), usize::MAX);
        assert_eq!(parse(&["-cmoe"]).unwrap().cpu_moe_layers(), usize::MAX);
        assert_eq!(parse(&["--n-cpu-moe", "3"]).unwrap().cpu_moe_layers(), 3);
        assert_eq!(parse(&["--n-cpu-moe=2"]).unwrap().cpu_moe_layers(), 2);
        assert_eq!(parse(&["-ncmoe", "5"]).unwrap().cpu_moe_layers(), 5);
        // --cpu-moe covers every layer whatever N says.
        assert_eq!(parse(&["--n-cpu-moe", "1", "--cpu-moe"]).unwrap().cpu_moe_layers(), usize::MAX);
        for bad in [&["--n-cpu-moe"][..], &["--n-cpu-moe", "-1"], &["--n-cpu-moe", "all"], &["--cpu-moe=3"]] {
            let e = parse(bad).expect_err("a bad value is a CLI error").to_string();
            assert!(e.contains("cpu-moe"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_log_says_what_moved() {
        let all = parse(&["--cpu-moe"]).unwrap();
        let (moe, dense) = (config(true), config(false));
        assert_eq!(parse(&[]).unwrap().note(false, &moe), None);
        assert!(all.note(true, &moe).unwrap().contains("runs on the CPU"));
        assert!(all.note(false, &dense).unwrap().contains("no MoE layers"));
        assert!(all.note(false, &moe).unwrap().contains("4 of 4 MoE layers"), "{:?}", all.note(false, &moe));
        let two = parse(&["--n-cpu-moe", "2"]).unwrap();
        assert!(two.note(false, &moe).unwrap().starts_with("--n-cpu-moe 2: the routed experts of 2 of 4"));
        let many = parse(&["--n-cpu-moe", "99"]).unwrap();
        assert!(many.note(false, &moe).unwrap().contains("4 of 4"));
    }
}
