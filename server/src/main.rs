//! `radix-serve`: an OpenAI-compatible local inference server built around a radix-tree KV
//! prefix cache. With no subcommand it serves; `template` renders a chat template;
//! `default-model` fetches the default model and prints its path.

mod moe_args;
mod sampling_args;
mod serve;
mod spec_args;
mod template_cmd;

use clap::{Parser, Subcommand};

/// Command-line interface.
#[derive(Debug, Parser)]
#[command(
    name = "radix-serve",
    version,
    about = "OpenAI-compatible local inference server with a radix-tree prefix cache"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: serve::ServeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Render a chat template for a chat-completions request and print the prompt.
    Template(template_cmd::TemplateArgs),
    /// Fetch the default model (Qwen2.5-Coder-0.5B-Instruct) if it is not cached yet and print
    /// its path, for scripts that run other servers on the same file.
    DefaultModel,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse_from(normalize_args(std::env::args()));
    if let Err(err) = radix_models::CpuIsa::from_env() {
        eprintln!("radix-serve: {err}");
        return std::process::ExitCode::FAILURE;
    }
    if cli.command.is_none() {
        radix_models::configure_candle_pool(cli.serve.threads());
        radix_models::configure_allocator();
    }
    let result = match cli.command {
        Some(Command::Template(args)) => template_cmd::run(&args),
        Some(Command::DefaultModel) => serve::print_default_model(),
        None => serve::run(cli.serve),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("radix-serve: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// llama-server spells some flags with several letters after one dash; clap takes one.
fn normalize_args(args: impl Iterator<Item = String>) -> Vec<String> {
    args.map(|a| match a.as_str() {
        "-np" => "--parallel".to_owned(),
        "-ctk" => "--cache-type-k".to_owned(),
        "-ctv" => "--cache-type-v".to_owned(),
        "-cmoe" => "--cpu-moe".to_owned(),
        "-ncmoe" => "--n-cpu-moe".to_owned(),
        _ => a,
    })
    .collect()
}
