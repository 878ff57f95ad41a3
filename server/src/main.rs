//! `radix-serve`: an OpenAI-compatible local inference server built around a radix-tree KV
//! prefix cache. Today it offers the `template` subcommand; serving lands with the engine.

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
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Render a chat template for a chat-completions request and print the prompt.
    Template(template_cmd::TemplateArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Template(args)) => template_cmd::run(&args),
        None => Err(anyhow::anyhow!(
            "serving is not built yet (the engine and HTTP API are open issues); \
             today radix-serve offers `radix-serve template --help`"
        )),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("radix-serve: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
