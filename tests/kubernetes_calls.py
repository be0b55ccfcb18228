"""What the code asks of the Kubernetes API, read from the code, and what RBAC rules grant.

The code side: every use of a ``kubernetes`` client API method in ``autoscaler/`` (a call, or the
method handed to a helper or to ``watch.Watch().stream``), as ``(apiGroup, resource, verb)``. The
verb comes from the method name's grammar (``read_`` get, ``list_`` list, ``create_`` create,
``replace_`` update, ``patch_`` patch, ``delete_`` delete, ``delete_collection_``
deletecollection; ``list_`` handed to ``stream`` or called with ``watch=True`` is watch); the
group and resource from the route the client itself sends the method to (its generated
``_<method>_serialize``), so ``create_namespaced_pod_eviction`` is ``pods/eviction`` in the core
group without a table of plurals. The custom-objects API takes its group and plural as
arguments: they must be literal strings (or a module's string constants) where it is called.

The rules side: ``Role`` and ``ClusterRole`` objects as ``kubectl kustomize`` renders them,
expanded to the same triples. ``compare`` answers as tests/terraform_support.py's does.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CODE = ROOT / "autoscaler"

Grant = tuple[str, str, str]
"""(apiGroup, resource with its subresource, verb), e.g. ("", "pods/eviction", "create")."""

# The method name's grammar: prefix -> (RBAC verb, the HTTP method the client must send)
VERBS: tuple[tuple[str, str, str], ...] = (
    ("delete_collection_", "deletecollection", "DELETE"),
    ("read_", "get", "GET"),
    ("get_", "get", "GET"),  # the custom-objects API's reads
    ("list_", "list", "GET"),
    ("create_", "create", "POST"),
    ("replace_", "update", "PUT"),
    ("patch_", "patch", "PATCH"),
    ("delete_", "delete", "DELETE"),
)
# Discovery, not an object: every API class has them and RBAC grants them to everyone
DISCOVERY = frozenset({"get_api_resources", "get_api_group", "get_api_versions", "get_code"})
SERIALIZER = re.compile(r"^    def _(\w+)_serialize\(", re.MULTILINE)
# a path to objects: /api/v1/<resource>... or /apis/<group>/<version>/<resource>...
OBJECT_PATH = re.compile(
    r"^/(api/v1|apis/[^/]+/[^/]+)/(namespaces/\{namespace\}/)?([^/{]+|\{plural\})"
)
SENDS = re.compile(r"method='([A-Z]+)',\s*resource_path='([^']+)'")


@dataclass(frozen=True)
class Route:
    """Where the client sends one API method: its class, HTTP method and path template."""

    api: str
    name: str
    method: str
    path: str

    def grant(self, verb: str, args: Mapping[str, str]) -> Grant:
        """The (group, resource, verb) of this route; ``args`` fills a custom object's group
        and plural."""
        path = self.path
        for name, value in args.items():
            path = path.replace("{" + name + "}", value)
        parts = [p for p in path.strip("/").split("/") if p]
        if parts[0] == "api":
            group, rest = "", parts[2:]
        else:
            group, rest = parts[1], parts[3:]
        if len(rest) >= 2 and rest[0] == "namespaces" and rest[1] == "{namespace}":
            rest = rest[2:]
        resource = rest[0]
        if len(rest) >= 3:
            resource = f"{resource}/{rest[2]}"
        return group, resource, verb

    @property
    def takes_arguments(self) -> tuple[str, ...]:
        """The path's parts that only the call's arguments can say (a custom object's)."""
        return tuple(p for p in ("group", "plural") if "{" + p + "}" in self.path)

    @property
    def params(self) -> tuple[str, ...]:
        """The method's parameters after ``self``, in order (for positional arguments)."""
        import kubernetes.client

        method = getattr(getattr(kubernetes.client, self.api), self.name)
        return tuple(inspect.signature(method).parameters)[1:]


def verb_of(method: str) -> tuple[str, str] | None:
    """(RBAC verb, HTTP method) the name's grammar says, or None for a name outside it."""
    for prefix, verb, http in VERBS:
        if method.startswith(prefix):
            return verb, http
    return None


@cache
def routes() -> dict[str, tuple[Route, ...]]:
    """Every API method of the installed kubernetes client, by name, from its generated code:
    one route per distinct grant (``create_namespaced_event`` is both the core group's events
    and events.k8s.io's; the same name in two versions of one group is one grant)."""
    spec = importlib.util.find_spec("kubernetes.client.api")
    assert spec is not None and spec.submodule_search_locations, "the kubernetes client"
    folder = Path(next(iter(spec.submodule_search_locations)))
    found: dict[str, dict[Grant, Route]] = {}
    for module in sorted(folder.glob("*_api.py")):
        text = module.read_text()
        classes = re.findall(r"^class (\w+)\b", text, flags=re.MULTILINE)
        if len(classes) != 1:
            continue
        for match in SERIALIZER.finditer(text):
            name = match[1]
            sends = SENDS.search(text, match.end())
            if name in DISCOVERY or sends is None or not OBJECT_PATH.match(sends[2]):
                continue  # discovery, /version, /.well-known, /logs: no object to grant on
            route = Route(classes[0], name, sends[1], sends[2])
            found.setdefault(name, {}).setdefault(route.grant("", {}), route)
    return {name: tuple(by_grant.values()) for name, by_grant in found.items()}


@dataclass
class Calls:
    """The grants the code needs, each with where it is used, and what could not be read."""

    grants: dict[Grant, list[str]] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)

    def add(self, grant: Grant, where: str) -> None:
        self.grants.setdefault(grant, []).append(where)


def _constants(tree: ast.Module) -> dict[str, str]:
    """A module's top-level ``NAME = "text"`` assignments (plain or annotated)."""
    found: dict[str, str] = {}
    for node in tree.body:
        target: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
        ):
            found[target.id] = value.value
    return found


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _is_watch(call: ast.Call | None) -> bool:
    return call is not None and any(
        k.arg == "watch" and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in call.keywords
    )


def _argument(
    call: ast.Call | None, route: Route, name: str, constants: Mapping[str, str]
) -> str | None:
    """A literal (or a module constant) the call passes as ``name``, by keyword or position."""
    if call is None:
        return None
    node: ast.expr | None = next((k.value for k in call.keywords if k.arg == name), None)
    if node is None and name in route.params:
        index = route.params.index(name)
        node = call.args[index] if index < len(call.args) else None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def _is_watch_call(node: ast.AST) -> bool:
    """``Watch()`` or ``watch.Watch()``: the client's watch helper being made."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "Watch") or (
        isinstance(func, ast.Attribute) and func.attr == "Watch"
    )


def _watch_names(tree: ast.AST) -> set[str]:
    """Names (and attributes, ``self.w``) a module binds to a ``Watch()``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_watch_call(node.value):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.add(target.id)
                elif isinstance(target, ast.Attribute):
                    found.add(target.attr)
    return found


def _is_watch_object(node: ast.AST, watches: set[str]) -> bool:
    """Whether ``node.stream(...)`` is the client's watch (not, say, urllib3's body stream)."""
    if _is_watch_call(node):
        return True
    if isinstance(node, ast.Name):
        return node.id in watches
    return isinstance(node, ast.Attribute) and node.attr in watches


def _pick(candidates: tuple[Route, ...], named: set[str]) -> Route | None:
    """The route of a method whose name two API classes share: the class the module names."""
    if len(candidates) == 1:
        return candidates[0]
    chosen = [r for r in candidates if r.api in named]
    return chosen[0] if len(chosen) == 1 else None


def scan_source(text: str, where: str, calls: Calls | None = None) -> Calls:
    """The grants one module's text needs (``where`` names it in the answers)."""
    calls = calls if calls is not None else Calls()
    tree = ast.parse(text)
    table = routes()
    constants = _constants(tree)
    parents = _parents(tree)
    named = set(re.findall(r"\b(\w+Api)\b", text))
    watches = _watch_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if (
                node.func.attr == "stream"
                and node.args
                and _is_watch_object(node.func.value, watches)
            ):
                handed = node.args[0]
                if not (isinstance(handed, ast.Attribute) and handed.attr in table):
                    calls.unknown.append(
                        f"{where}:{node.lineno}: stream() of something that is not a client "
                        "API method named where it is handed over"
                    )
            if node.func.attr == "call_api":
                calls.unknown.append(f"{where}:{node.lineno}: a raw call_api() call")
        if not (isinstance(node, ast.Attribute) and node.attr in table):
            continue
        method, candidates = node.attr, table[node.attr]
        route = _pick(candidates, named)
        if route is None:
            apis = " or ".join(r.api for r in candidates)
            calls.unknown.append(
                f"{where}:{node.lineno}: {method} is {apis}: name the one used in the module"
            )
            continue
        grammar = verb_of(method)
        if grammar is None:
            calls.unknown.append(f"{where}:{node.lineno}: {method} is outside the name grammar")
            continue
        verb = grammar[0]
        parent = parents.get(node)
        call = parent if isinstance(parent, ast.Call) and parent.func is node else None
        if call is None and isinstance(parent, ast.Call) and node in parent.args:
            # handed over: to watch.Watch().stream (a watch), or to a helper that calls it
            func = parent.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "stream"
                and _is_watch_object(func.value, watches)
            ):
                verb = "watch"
        elif _is_watch(call):
            verb = "watch"
        args: dict[str, str] = {}
        for name in route.takes_arguments:
            value = _argument(call, route, name, constants)
            if value is None:
                calls.unknown.append(
                    f"{where}:{node.lineno}: {method}'s {name} is not a literal or a constant"
                )
                break
            args[name] = value
        else:
            calls.add(route.grant(verb, args), f"{where}:{node.lineno}")
    return calls


def code_calls(folder: Path = CODE) -> Calls:
    """The grants every module under ``folder`` needs."""
    calls = Calls()
    for path in sorted(folder.rglob("*.py")):
        scan_source(path.read_text(), str(path.relative_to(ROOT)), calls)
    return calls


@dataclass(frozen=True)
class Rule:
    """One RBAC rule, expanded: which object granted it, and to which names, if held to some."""

    kind: str
    name: str
    grant: Grant
    resource_names: tuple[str, ...]


def granted(objects: Iterable[Mapping[str, Any]]) -> list[Rule]:
    """Every (group, resource, verb) the rendered Roles and ClusterRoles grant."""
    rules: list[Rule] = []
    for obj in objects:
        if obj.get("kind") not in ("Role", "ClusterRole"):
            continue
        for rule in obj.get("rules") or []:
            for group in rule.get("apiGroups") or [""]:
                for resource in rule.get("resources") or []:
                    for verb in rule.get("verbs") or []:
                        rules.append(
                            Rule(
                                obj["kind"],
                                obj["metadata"]["name"],
                                (group, resource, verb),
                                tuple(rule.get("resourceNames") or ()),
                            )
                        )
    return rules


def show(grant: Grant) -> str:
    group, resource, verb = grant
    return f"{verb} {resource}" + (f" ({group})" if group else "")


def compare(calls: Calls, rules: Sequence[Rule]) -> list[str]:
    """What is wrong between the code and the rules: nothing when they match exactly."""
    problems = [f"not understood: {u}" for u in calls.unknown]
    have = {r.grant for r in rules}
    for grant, where in sorted(calls.grants.items()):
        if grant not in have:
            problems.append(f"needed but not granted: {show(grant)} (used at {', '.join(where)})")
    for grant in sorted(have - set(calls.grants)):
        problems.append(f"granted but not needed by the code: {show(grant)}")
    return problems
