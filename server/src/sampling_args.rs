//! The server's sampling defaults: what a request gets for each field it leaves out. Layered
//! as llama-server layers them: its built-in defaults, then what the model's files recommend
//! (GGUF `general.sampling.*`, `generation_config.json`), then the command line.

use anyhow::bail;
use radix_models::RecommendedSampling;
use radix_serve::api::llama_server_sampling;
use radix_serve::engine::SamplingParams;

/// Sampling flags, named as llama-server names them.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SamplingArgs {
    /// Temperature for requests that set none (0 is greedy). Default: the model's
    /// recommendation, else 0.8.
    #[arg(long = "temp", value_name = "T")]
    temperature: Option<f32>,
    /// Top-k for requests that set none (0 is off). Default: the model's, else 40.
    #[arg(long, value_name = "N")]
    top_k: Option<i64>,
    /// Top-p for requests that set none (1 is off). Default: the model's, else 0.95.
    #[arg(long, value_name = "P")]
    top_p: Option<f32>,
    /// Min-p for requests that set none (0 is off). Default: the model's, else 0.05.
    #[arg(long, value_name = "P")]
    min_p: Option<f32>,
    /// Repetition penalty for requests that set none (1 is off). Default: the model's, else 1.
    #[arg(long, value_name = "R")]
    repeat_penalty: Option<f32>,
    /// Presence penalty for requests that set none.
    #[arg(long, value_name = "P")]
    presence_penalty: Option<f32>,
    /// Frequency penalty for requests that set none.
    #[arg(long, value_name = "P")]
    frequency_penalty: Option<f32>,
    /// Seed of the random sampler for requests that set none (-1: a new one each request),
    /// so a run is repeatable on one machine.
    #[arg(short = 's', long, value_name = "N", allow_negative_numbers = true)]
    seed: Option<i64>,
    /// Never end a reply at a stop token (EOS, end of turn) unless the request says
    /// `"ignore_eos": false`: replies run to their token limit, as for a benchmark.
    #[arg(long)]
    ignore_eos: bool,
}

/// The defaults requests sample with, and one line saying where they came from.
#[derive(Debug)]
pub struct SamplingDefaults {
    /// Settings for each field a request leaves out.
    pub params: SamplingParams,
    /// For the start-up log.
    pub description: String,
}

impl SamplingArgs {
    /// llama-server's defaults, under `model`'s recommendation, under these flags. A model
    /// recommendation out of range is left out with a warning (the file is not the user's to
    /// fix); a flag out of range is an error naming it.
    pub fn defaults(&self, model: &RecommendedSampling) -> anyhow::Result<SamplingDefaults> {
        let mut params = llama_server_sampling();
        let recommended = SamplingParams {
            temperature: model.temperature.unwrap_or(params.temperature),
            top_k: model.top_k.unwrap_or(params.top_k),
            top_p: model.top_p.unwrap_or(params.top_p),
            min_p: model.min_p.unwrap_or(params.min_p),
            repetition_penalty: model.repetition_penalty.unwrap_or(params.repetition_penalty),
            ..params.clone()
        };
        let mut from_model = String::new();
        if !model.is_empty() {
            match recommended.validate() {
                Ok(()) => {
                    params = recommended;
                    from_model = format!(" (the model's {})", model.source.join(", "));
                }
                Err(why) => eprintln!(
                    "radix-serve: warning: the model's recommended sampling ({}) is unusable, using llama-server's \
                     defaults instead: {why}",
                    model.source.join(", ")
                ),
            }
        }
        let flagged = SamplingParams {
            temperature: self.temperature.unwrap_or(params.temperature),
            top_k: self.top_k.map_or(params.top_k, |k| k.max(0) as usize),
            top_p: self.top_p.unwrap_or(params.top_p),
            min_p: self.min_p.unwrap_or(params.min_p),
            repetition_penalty: self.repeat_penalty.unwrap_or(params.repetition_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(params.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(params.frequency_penalty),
            seed: match self.seed {
                Some(seed) if seed >= 0 => Some(seed as u64),
                _ => None,
            },
            logprobs: None,
            ignore_eos: self.ignore_eos,
        };
        if let Err(why) = flagged.validate() {
            // The message names the request field; say which flag sets it.
            let flag = [
                ("'presence_penalty' and", "--presence-penalty or --frequency-penalty"),
                ("temperature", "--temp"),
                ("top_p", "--top-p"),
                ("min_p", "--min-p"),
                ("presence_penalty", "--presence-penalty"),
                ("frequency_penalty", "--frequency-penalty"),
                ("repetition_penalty", "--repeat-penalty"),
            ]
            .into_iter()
            .find(|(field, _)| why.contains(field))
            .map_or("a sampling flag", |(_, flag)| flag);
            bail!("{flag}: {why}");
        }
        let p = &flagged;
        let seed = p.seed.map_or("random".to_owned(), |s| s.to_string());
        let description = format!(
            "temperature {}, top-k {}, top-p {}, min-p {}, repeat penalty {}, seed {seed}{}{from_model}",
            p.temperature,
            p.top_k,
            p.top_p,
            p.min_p,
            p.repetition_penalty,
            if p.ignore_eos { ", ignoring EOS" } else { "" }
        );
        Ok(SamplingDefaults { params: flagged, description })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_recommendation_or_flags_the_defaults_are_llama_servers() {
        let d = SamplingArgs::default().defaults(&RecommendedSampling::default()).unwrap();
        assert_eq!(d.params, llama_server_sampling());
        assert!(!d.description.contains("the model's"), "{}", d.description);
    }

    #[test]
    fn flags_beat_the_model_which_beats_llama_server() {
        let model = RecommendedSampling {
            temperature: Some(0.6),
            top_k: Some(20),
            top_p: Some(0.95),
            source: vec!["general.sampling.temp".into()],
            ..Default::default()
        };
        let args = SamplingArgs { temperature: Some(0.2), seed: Some(9), ..Default::default() };
        let d = args.defaults(&model).unwrap();
        assert_eq!((d.params.temperature, d.params.top_k, d.params.top_p), (0.2, 20, 0.95));
        assert_eq!((d.params.min_p, d.params.seed), (0.05, Some(9)));
        assert!(d.description.contains("general.sampling.temp"), "{}", d.description);
    }

    #[test]
    fn an_unusable_recommendation_is_dropped_and_a_bad_flag_is_an_error_naming_it() {
        let model = RecommendedSampling { temperature: Some(9.0), source: vec!["x".into()], ..Default::default() };
        let d = SamplingArgs::default().defaults(&model).unwrap();
        assert_eq!(d.params, llama_server_sampling());
        let err = SamplingArgs { top_p: Some(3.0), ..Default::default() }
            .defaults(&RecommendedSampling::default())
            .unwrap_err();
        assert!(err.to_string().starts_with("--top-p:"), "{err}");
        let seed = SamplingArgs { seed: Some(-1), ..Default::default() };
        assert_eq!(seed.defaults(&RecommendedSampling::default()).unwrap().params.seed, None);
    }
}
