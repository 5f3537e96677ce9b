"""The plugin's real entry point with its compaction at rest put an hour off.

Why: the plugin compacts its checkpoint journal one second after its last
call (``driver.claims.compaction.COMPACT_AT_REST_S``), which would race a
test's SIGTERM; with the compaction at rest out of the way, only the stop's
own compaction can leave the checkpoint file current. Tests swap
:func:`argv_without_rest_compaction` in for ``PluginProcess.argv``.
"""

from __future__ import annotations

from tests.harness.simnode import PluginProcess

NO_REST_COMPACTION = (
    "import sys; from driver.claims import compaction; compaction.COMPACT_AT_REST_S = 3600.0; "
    "from plugin.main import main; sys.exit(main(sys.argv[1:]))"
)
_argv = PluginProcess.argv


def argv_without_rest_compaction(self: PluginProcess) -> list[str]:
    python, module_flag, module, *args = _argv(self)
    assert (module_flag, module) == ("-m", "plugin.main")
    return [python, "-c", NO_REST_COMPACTION, *args]
