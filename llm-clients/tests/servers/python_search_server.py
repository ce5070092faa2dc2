"""An MCP server built with the official Python SDK (`pip install mcp`,
2.x: `MCPServer`, FastMCP's new name), for `tests/mcp_real.rs` (issue #61).

One tool, `search(q: str)`, that allows 3 calls in any rolling second and
otherwise answers an `isError` result whose whole text is
"Rate limit exceeded, retry after 1 seconds" (refused calls do not count
against the window). With `--refusal raise` the tool raises `ToolError`
instead, as SDK code usually does (the SDK then words it "Error executing
tool <name>: <text>"); `--tool-name` renames the tool. Every call is logged
as one JSON line:
{"t": <unix seconds, float>, "q": ..., "refused": true|false}.

    python3 llm-clients/tests/servers/python_search_server.py \
        --port 18611 --log /tmp/py-search.jsonl

Serves streamable HTTP on http://127.0.0.1:<port>/mcp.
"""

import argparse
import asyncio
import collections
import json
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations

LIMIT = 3
WINDOW = 1.0
REFUSAL = "Rate limit exceeded, retry after 1 seconds"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=18611)
    parser.add_argument("--log", default="/tmp/py-search.jsonl")
    parser.add_argument("--work-ms", type=int, default=50, help="how long a served search takes")
    parser.add_argument(
        "--refusal",
        choices=["result", "raise"],
        default="result",
        help="result: return the isError result; raise: raise ToolError, which the SDK"
        ' words "Error executing tool <name>: <text>"',
    )
    parser.add_argument("--tool-name", default="search")
    args = parser.parse_args()

    accepted: collections.deque[float] = collections.deque()
    log = open(args.log, "a", buffering=1)
    server = MCPServer("python-search")

    @server.tool(name=args.tool_name, annotations=ToolAnnotations(read_only_hint=True))
    async def search(q: str) -> CallToolResult:
        """Search the index (3 calls in any rolling second)."""
        now = time.time()
        mono = time.monotonic()
        while accepted and mono - accepted[0] >= WINDOW:
            accepted.popleft()
        refused = len(accepted) >= LIMIT
        if not refused:
            accepted.append(mono)
        log.write(json.dumps({"t": now, "q": q, "refused": refused}) + "\n")
        if refused and args.refusal == "raise":
            raise ToolError(REFUSAL)
        if refused:
            return CallToolResult(content=[TextContent(type="text", text=REFUSAL)], is_error=True)
        await asyncio.sleep(args.work_ms / 1000)
        return CallToolResult(content=[TextContent(type="text", text=f"results for {q}")])

    server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
