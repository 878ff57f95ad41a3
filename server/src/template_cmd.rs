//! `radix-serve template`: render a model's chat template for a request, exactly as the server
//! will, for people debugging templates and for black-box tests.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use radix_templates::prepare::PreparedTemplate;
use radix_templates::{ChatRequest, ChatTemplate, TemplateSource};

/// Arguments of `radix-serve template`.
#[derive(Debug, clap::Args)]
pub struct TemplateArgs {
    /// Where the template is: tokenizer_config.json, a .jinja file, a .gguf model, or a model directory.
    #[arg(long, value_name = "PATH")]
    template: PathBuf,
    /// An OpenAI chat-completions request body (JSON file; `-` reads standard input).
    #[arg(long, value_name = "FILE")]
    request: PathBuf,
    /// Render the messages exactly as given, without radix-serve's message preparation.
    #[arg(long)]
    no_prepare: bool,
    /// What to print: the rendered prompt, or the request after preparation (as JSON).
    #[arg(long, value_enum, default_value_t = Emit::Prompt)]
    emit: Emit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Emit {
    Prompt,
    PreparedRequest,
}

/// Runs the subcommand: the prompt goes to stdout with no newline added.
pub fn run(args: &TemplateArgs) -> anyhow::Result<()> {
    let body = if args.request.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("cannot read the request from standard input")?
    } else {
        std::fs::read_to_string(&args.request)
            .with_context(|| format!("cannot read the request file {}", args.request.display()))?
    };
    let body: serde_json::Value = serde_json::from_str(&body)
        .with_context(|| format!("the request {} is not valid JSON", args.request.display()))?;
    let request = ChatRequest::from_json(&body).context("invalid request")?;
    let source = TemplateSource::from_path(&args.template)?;
    let template = ChatTemplate::new(source)?;

    let output = if args.no_prepare {
        match args.emit {
            Emit::Prompt => template.render(&request.render_input())?,
            Emit::PreparedRequest => serde_json::to_string_pretty(&request.to_json())?,
        }
    } else {
        let prepared = PreparedTemplate::new(template);
        match args.emit {
            Emit::Prompt => prepared.render(&request)?,
            Emit::PreparedRequest => serde_json::to_string_pretty(
                &radix_templates::prepare::prepare_request(&request, &prepared.behavior)?.to_json(),
            )?,
        }
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(output.as_bytes())?;
    stdout.flush()?;
    Ok(())
}
