//! The `agent-sim` command as people see it: the flags of [`crate::args`]
//! with the defaults of [`crate::defaults`] shown in each flag's help.

use clap::{CommandFactory as _, FromArgMatches as _};

use crate::args::Cli;

/// The `agent-sim` command: [`Cli`] with the defaults of
/// [`crate::defaults::defaults`] shown in each flag's help.
pub fn command() -> clap::Command {
    let shown = crate::defaults::shown_defaults();
    let mut cmd = Cli::command();
    for (id, value) in shown {
        cmd = cmd.mut_arg(id, |a| {
            let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
            a.help(format!("{help} [default: {value}]"))
        });
    }
    cmd
}

/// Parses the process's arguments with [`command`].
pub fn parse() -> Result<Cli, clap::Error> {
    let matches = command().try_get_matches()?;
    Cli::from_arg_matches(&matches)
}
