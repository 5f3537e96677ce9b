"""The floors under the plugin bench's figures: what no kubelet plugin can go below.

Why it exists: the plugin bench compares our prepare and unprepare with the
reference driver's, but both pay for things neither controls: the gRPC round
trip over a Unix socket and, for a prepare, the claim GET from the apiserver.
On a loaded machine those floors move by 2x, so a ratio of the totals hides
what each plugin's own work costs. :class:`Floors` measures them in the same
rounds as the contenders (``contenders.alternate``), under the same load:

- the round trip of a NodePrepareResources with one claim to a trivial
  grpclib server in a process of its own, answering an empty response at
  once, on a Unix socket (issue 36's floor; the plugin served with grpclib
  until then); and the same round trip to a trivial server of the plugin's
  own (``plugin.servers.unix_server``), which is the floor of ours alone;
  both on uvloop, as the plugin serves;
- the claim GET through our own client (``driver.kube.api.KubeApi`` and
  ``driver.kube.objects.ApiClaimReader``, the plugin's read), one connection
  kept open as the plugin keeps it;
- the resident memory of a process that imports what the plugin imports
  (``plugin.app``, ``plugin.main``) and does nothing else.

A prepare's floor is the round trip plus the GET; an unprepare's the round
trip alone (the claim object is not read). :func:`above_floor_table` prints,
for each median, what each contender spends above the grpclib floor and
ours over theirs, then the same above the plugin's own server's floor (on
which ours is only its own work on the claim). Figures only.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from driver.kube.api import KubeApi
from driver.kube.objects import ApiClaimReader
from plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from tests.bench.contenders import Contender, percentile


class _Trivial:
    async def NodePrepareResources(self, request: object, context: object) -> object:
        return dra_v1_pb2.NodePrepareResourcesResponse()

    async def NodeUnprepareResources(self, request: object, context: object) -> object:
        return dra_v1_pb2.NodeUnprepareResourcesResponse()


def serve(kind: str, path: Path) -> None:
    """Serve ``DRAPlugin`` v1 on ``path`` with methods that answer at once,
    with grpclib (``kind`` "grpclib") or the plugin's own server ("own")."""
    service = dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"]

    async def run() -> None:
        if kind == "own":
            from plugin.servers.unix_server import UnixGrpcServer

            own = UnixGrpcServer()
            own.add_service(service, _Trivial())
            await own.start(path)
        else:
            await _grpclib_server(service).start(path=str(path))
        await asyncio.Event().wait()

    import uvloop

    uvloop.run(run())


def _grpclib_server(service: Any) -> Any:
    from google.protobuf.message_factory import GetMessageClass
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server

    trivial = _Trivial()

    def unary(name: str) -> Any:
        async def call(stream: Any) -> None:
            request = await stream.recv_message()
            await stream.send_message(await getattr(trivial, name)(request, stream))

        return call

    class Mapping:
        def __mapping__(self) -> dict[str, Handler]:
            return {
                f"/{service.full_name}/{m.name}": Handler(
                    unary(m.name),
                    Cardinality.UNARY_UNARY,
                    GetMessageClass(m.input_type),
                    GetMessageClass(m.output_type),
                )
                for m in service.methods
            }

    return Server([Mapping()])


IMPORTS = "import plugin.app, plugin.main"
RSS_PROBE = (
    f"{IMPORTS}\nimport re\nfrom pathlib import Path\n"
    "print(int(re.search(r'VmRSS:\\s+(\\d+)', Path('/proc/self/status').read_text()).group(1)))"
)


def import_rss_mb() -> float:
    """Resident memory of a process that only imports the plugin's modules."""
    out = subprocess.run(
        [sys.executable, "-c", RSS_PROBE], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1]) / 1024


class Floors:
    """The two latency floors, sampled in rounds like a contender."""

    label = "floors"

    def __init__(self, run_dir: Path, kubeconfig: Path, namespace: str, claim: str) -> None:
        self.rtt_ms: list[float] = []
        self.own_rtt_ms: list[float] = []
        self.get_ms: list[float] = []
        self.import_rss_mb = import_rss_mb()
        self._servers: list[subprocess.Popen[bytes]] = []
        self._channels: list[grpc.Channel] = []
        self._stubs = [self._start(run_dir, kind) for kind in ("grpclib", "own")]
        self._request = dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=namespace, name=claim, uid="0" * 36)]
        )
        self._namespace, self._claim = namespace, claim
        self._loop = asyncio.new_event_loop()
        self._reader, self._api = self._loop.run_until_complete(self._connect(kubeconfig))
        self.run(5, record=False)  # warm both connections

    def _start(self, run_dir: Path, kind: str) -> Any:
        sock = run_dir / f"trivial-{kind}.sock"
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.bench.floors", "serve", kind, str(sock)],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._servers.append(server)
        deadline = time.monotonic() + 60
        while not sock.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the trivial {kind} server did not start")
            time.sleep(0.05)
        channel = grpc.insecure_channel(f"unix://{sock}")
        self._channels.append(channel)
        return dra_v1_pb2_grpc.DRAPluginStub(channel)

    @staticmethod
    async def _connect(kubeconfig: Path) -> tuple[ApiClaimReader, KubeApi]:
        api = await KubeApi.connect(str(kubeconfig))
        return ApiClaimReader(api), api

    async def _gets(self, count: int) -> list[float]:
        out = []
        for _ in range(count):
            t0 = time.perf_counter()
            await self._reader.read_claim(self._namespace, self._claim)
            out.append((time.perf_counter() - t0) * 1000)
        return out

    def run(self, pairs: int, *, record: bool = True) -> None:
        rtts: list[list[float]] = [[], []]
        for _ in range(pairs):
            for stub, rtt in zip(self._stubs, rtts, strict=True):
                t0 = time.perf_counter()
                stub.NodePrepareResources(self._request, timeout=45)
                rtt.append((time.perf_counter() - t0) * 1000)
        gets = self._loop.run_until_complete(self._gets(pairs))
        if record:
            self.rtt_ms += rtts[0]
            self.own_rtt_ms += rtts[1]
            self.get_ms += gets

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self._loop.run_until_complete(self._api.close())
        self._loop.close()
        for server in self._servers:
            server.terminate()
            server.wait(timeout=10)

    def describe(self) -> str:
        return (
            f"floors: gRPC round trip (grpclib, Unix socket) median "
            f"{statistics.median(self.rtt_ms):.2f} ms, p99 {percentile(self.rtt_ms, 0.99):.2f}; "
            f"to the plugin's own server median {statistics.median(self.own_rtt_ms):.2f} ms, "
            f"p99 {percentile(self.own_rtt_ms, 0.99):.2f}; "
            f"claim GET (our client) median {statistics.median(self.get_ms):.2f} ms, "
            f"p99 {percentile(self.get_ms, 0.99):.2f}; "
            f"RSS of the plugin's imports alone {self.import_rss_mb:.1f} MB"
        )


def _above(floor: float, samples: str) -> Callable[[Contender], float]:
    return lambda c: statistics.median(getattr(c, samples)) - floor


def above_floor_table(contenders: list[Contender], floors: Floors, ratio_to: list[str]) -> str:
    """Per median, what each contender spends above the floor, and ours over
    theirs (the issue's "at most half": <= 0.50). The import floor is
    Python's, so RSS has no row here (:meth:`Floors.describe` prints it)."""
    get = statistics.median(floors.get_ms)
    rows: dict[str, Callable[[Contender], float]] = {}
    for name, rtts in (("grpclib rtt", floors.rtt_ms), ("own rtt", floors.own_rtt_ms)):
        rtt = statistics.median(rtts)
        rows[f"prepare median - ({name} + GET {rtt + get:.2f})"] = _above(rtt + get, "prepare_ms")
        rows[f"unprepare median - ({name} {rtt:.2f})"] = _above(rtt, "unprepare_ms")
    ours = contenders[0]
    heads = [c.label for c in contenders] + [f"{ours.label}/{t}" for t in ratio_to]
    width = max(len(k) for k in rows)
    cols = [max(len(h), 8) for h in heads]
    out = ["  ".join([("above floor, ms").ljust(width),
                      *(h.rjust(w) for h, w in zip(heads, cols, strict=True))])]  # fmt: skip
    for key, fn in rows.items():
        values = {c.label: fn(c) for c in contenders}
        cells = [f"{values[c.label]:.2f}" for c in contenders]
        cells += [
            f"{values[ours.label] / values[t]:.2f}" if values[t] > 0 else "-" for t in ratio_to
        ]
        out.append(
            "  ".join([key.ljust(width), *(x.rjust(w) for x, w in zip(cells, cols, strict=True))])
        )
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], Path(sys.argv[3]))
