"""The `sluice` command: noun-verb sub-commands, each in its own module."""

from __future__ import annotations

import os
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from sluice.cli import bench, dataset, health, job, net, node, priority, queue, sim, tenant, up
from sluice.cli.client import CliError, cli_error
from sluice.cli.demo import demo
from sluice.cli.output import err_console, fail
from sluice.cli.summaries import add_summaries
from sluice.cli.usage import usage
from sluice.client import SluiceError
from sluice.settings import SettingsError

DEBUG_ENV = "SLUICE_DEBUG"
"""Set to 1 to see the Python traceback of an unexpected failure (for bug reports)."""


class _NoTracebacks(TyperGroup):
    """The last line of defence: whatever a command did not turn into a message itself
    (a bad file handed to a benchmark, a library's ValueError) is printed as one line and
    exits 1, not dumped as a traceback. Usage errors, exits and aborts pass through."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except typer.BadParameter as err:
            # typer hands on pydantic's words for a bad choice: "Value error, 'runing' is not one of ...".
            err.message = err.message.removeprefix("Value error, ")
            raise
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except BrokenPipeError:
            # The reader went away (`sluice ... --help | head`): click's own handling exits 1
            # quietly, as a pipe's writer should, rather than "error: BrokenPipeError".
            raise
        except CliError as err:
            fail(err)
        except SluiceError as err:
            fail(cli_error(err))
        except SettingsError as err:  # a bad SLUICE_* variable or settings.yaml key, named
            fail(CliError(str(err), code=2))
        except Exception as err:
            if os.environ.get(DEBUG_ENV):
                raise
            err_console.print(f"[bold red]error:[/] {escape(f'{type(err).__name__}: {err}')}", markup=True)
            err_console.print(f"  (set {DEBUG_ENV}=1 to see where it failed)", markup=False)
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=_NoTracebacks,
    help="sluice: a progress-aware deep-learning training platform.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(job.app, name="job")
app.add_typer(node.app, name="node")
app.add_typer(tenant.app, name="tenant")
app.add_typer(queue.app, name="queue")
app.add_typer(priority.app, name="priority")
app.add_typer(dataset.app, name="dataset")
app.add_typer(sim.app, name="sim")
app.add_typer(bench.app, name="bench")
app.add_typer(health.app, name="health")
app.add_typer(net.app, name="net")
app.command("demo")(demo)
app.command("up")(up.up)
app.command("down")(up.down)
app.command("usage")(usage)
add_summaries(app)

if __name__ == "__main__":  # `python -m sluice.cli.main ...` ran nothing and exited 0 (sdkwalk s32)
    app()
