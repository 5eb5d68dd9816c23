"""The scheme table (lorapool.api.schemes) against every reader of it: each entry's validation (the
pydantic rules, the CRD's CEL rules and the adapter set's wire pattern), the registry that opens
its sources, and the renderer that mounts them and passes their credentials. One row per scheme,
so a new entry fails here until every reader knows it."""

from __future__ import annotations

import copy
import re
from typing import Annotated, Any

import pytest
from pydantic import TypeAdapter, ValidationError

from lorapool.api.adapterset import DesiredAdapter
from lorapool.api.common import ADAPTER_SOURCE, BASE_MODEL_SOURCE, SOURCE_PATTERN
from lorapool.api.load import parse_object
from lorapool.api.models import Credentials, LoRAPool
from lorapool.api.schemes import SCHEMES, CredentialsKind, Delivery, ModelArg, Scheme, named, scheme_of
from lorapool.errors import SourceError, SpecError
from lorapool.plan.adapters import merge_adapters
from lorapool.plan.planner import AdapterRank, plan_pool
from lorapool.render import source_access
from lorapool.render.manifests import RenderOptions, render_pool
from lorapool.sources.registry import OPENERS, open_source

_ADAPTER = TypeAdapter(Annotated[str, ADAPTER_SOURCE])
_BASE_MODEL = TypeAdapter(Annotated[str, BASE_MODEL_SOURCE])
_BASE_MODEL_SCHEMES = [s for s in SCHEMES if s.base_model is not None]


def _by_name(scheme: Scheme) -> str:
    return scheme.name


def _refusal(adapter: TypeAdapter[str], value: str) -> str:
    with pytest.raises(ValidationError) as err:
        adapter.validate_python(value)
    return str(err.value.errors()[0]["msg"])


def _bad(scheme: Scheme) -> str:
    """A source of ``scheme`` its own rule refuses: a space right after the prefix."""
    return f"{scheme.prefix} x"


# --- the table itself ----------------------------------------------------------------------------


def test_names_and_uri_schemes_are_unique() -> None:
    names = [s.name for s in SCHEMES]
    uri_schemes = [u for s in SCHEMES for u in s.uri_schemes]
    assert len(set(names)) == len(names)
    assert len(set(uri_schemes)) == len(uri_schemes)


@pytest.mark.parametrize("scheme", SCHEMES, ids=_by_name)
def test_an_entry_is_consistent(scheme: Scheme) -> None:
    assert scheme.name in scheme.uri_schemes and scheme.prefix == f"{scheme.name}://"
    assert all(re.fullmatch(scheme.scheme_regex, u) for u in scheme.uri_schemes)
    rules = [scheme.adapter, *([scheme.base_model.rule] if scheme.base_model else [])]
    for rule in rules:
        assert all(p.startswith(rule.when) for p in scheme.prefixes), "the rule must cover every prefix"
        assert rule.message.endswith(f"e.g. {rule.example}") and scheme.owns(rule.example)
    assert (scheme.base_model is not None and scheme.base_model.model_arg is ModelArg.MOUNT_PATH) == (
        scheme.base_model is not None and scheme.delivery is Delivery.MOUNTED
    ), "a mounted base model is read under its mount, and only a mounted one"
    assert scheme_of(scheme.adapter.example) is scheme
    assert all(named(u) is scheme for u in scheme.uri_schemes)


# --- validation: pydantic, CEL, the wire pattern -----------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES, ids=_by_name)
def test_an_adapter_source_of_each_scheme_validates_as_its_entry_says(scheme: Scheme) -> None:
    rest = scheme.adapter.example.removeprefix(scheme.prefix)
    for prefix in scheme.prefixes:
        _ADAPTER.validate_python(prefix + rest)
        DesiredAdapter(name="x", source=prefix + rest)
        assert re.fullmatch(SOURCE_PATTERN, prefix + rest)
    assert _refusal(_ADAPTER, _bad(scheme)) == scheme.adapter.message


@pytest.mark.parametrize("scheme", SCHEMES, ids=_by_name)
def test_a_base_model_source_of_each_scheme_validates_as_its_entry_says(scheme: Scheme) -> None:
    if scheme.base_model is None:
        assert _refusal(_BASE_MODEL, scheme.adapter.example).startswith("must start with ")
        return
    _BASE_MODEL.validate_python(scheme.base_model.rule.example)
    assert re.fullmatch(scheme.base_model.uri_pattern, scheme.base_model.rule.example)
    assert _refusal(_BASE_MODEL, _bad(scheme)) == scheme.base_model.rule.message


def test_an_unknown_scheme_is_told_every_scheme_of_the_table() -> None:
    adapter = _refusal(_ADAPTER, "ftp://files.example/adapters/sql-coder.tar.gz")
    base = _refusal(_BASE_MODEL, "ftp://files.example/models/llama")
    assert adapter.startswith("must start with ") and base.startswith("must start with ")
    assert all(s.prefix in adapter for s in SCHEMES)
    assert all(s.prefix in base for s in _BASE_MODEL_SCHEMES)


@pytest.mark.parametrize("scheme", SCHEMES, ids=_by_name)
def test_the_crd_carries_each_entry_rule_as_cel_with_its_words(scheme: Scheme) -> None:
    def cel(rule_regex: str, when: str) -> str:
        return f"!self.startsWith('{when}') || self.matches(r'{rule_regex}')"

    adapter_rules = _ADAPTER.json_schema()["x-kubernetes-validations"]
    assert {"rule": cel(scheme.adapter.regex, scheme.adapter.when), "message": scheme.adapter.message} in adapter_rules
    if scheme.base_model is not None:
        rule = scheme.base_model.rule
        assert {"rule": cel(rule.regex, rule.when), "message": rule.message} in _BASE_MODEL.json_schema()[
            "x-kubernetes-validations"
        ]


# --- sources/registry.py: a Source for every scheme -----------------------------------------------


def test_the_registry_opens_exactly_the_schemes_of_the_table() -> None:
    assert sorted(s.name for s in OPENERS) == sorted(s.name for s in SCHEMES), (
        "each scheme needs its Source in lorapool.sources and its opener in sources/registry.py OPENERS"
    )


@pytest.mark.parametrize("scheme", SCHEMES, ids=_by_name)
def test_the_registry_opens_each_entry_example(scheme: Scheme) -> None:
    """Every entry: downloaded and local ones are fetched by their Source; a mounted one is copied
    from its mount by the same kind of Source (opening does no I/O)."""
    rest = scheme.adapter.example.removeprefix(scheme.prefix)
    for prefix in scheme.prefixes:
        assert open_source(prefix + rest).describe() == prefix + rest


def test_an_unknown_scheme_is_told_every_scheme_the_registry_opens() -> None:
    with pytest.raises(SourceError) as err:
        open_source("ftp://files.example/adapters/sql-coder.tar.gz")
    assert str(err.value).endswith("use one of " + ", ".join(p for s in OPENERS for p in s.prefixes))
    assert all(p in str(err.value) for s in SCHEMES for p in s.prefixes)


# --- the renderer: credentials and mounted sources ---------------------------------------------


def _render(doc: dict[str, Any]) -> list[dict[str, Any]]:
    pool = parse_object(doc)
    assert isinstance(pool, LoRAPool)
    merged = merge_adapters(pool, [])
    plan = plan_pool(pool.spec, [AdapterRank(a.spec.name, a.field, a.spec.rank) for a in merged.adapters])
    return render_pool(pool, plan, merged.adapters, RenderOptions(lorapool_image="lorapool:test"))


def _engine_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    engine = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-engine"))
    pod: dict[str, Any] = engine["spec"]["template"]["spec"]
    return pod


def _with_sources(example_doc: dict[str, Any], *, base_model: str | None = None, adapter: str | None = None) -> Any:
    doc = copy.deepcopy(example_doc)
    if base_model is not None:
        doc["spec"]["baseModel"]["source"] = base_model
    if adapter is not None:
        doc["spec"]["adapters"] = [{"name": "a", "source": adapter, "rank": 8}]
    return doc


def test_the_renderer_passes_credentials_for_every_scheme_with_a_secret(example_doc: dict[str, Any]) -> None:
    secret_kinds = {CredentialsKind.SECRET, CredentialsKind.SECRET_KEY}
    assert sorted(s.name for s in source_access.CREDENTIALS_ENV) == sorted(
        s.name for s in SCHEMES if s.credentials.kind in secret_kinds
    ), "a scheme with a Secret needs its env in render/source_access.py CREDENTIALS_ENV"
    doc = copy.deepcopy(example_doc)
    doc["spec"]["credentials"] = {
        "huggingFace": {"name": "hf", "key": "token"},
        "s3": {"secretName": "s3", "endpoint": "https://minio.example:9000", "region": "us-east-1"},
        "oci": {"secretName": "registry", "plainHTTP": ["registry.lorapool-system:5000"]},
    }
    expected = [
        e
        for s in SCHEMES
        if s.credentials.kind in secret_kinds
        for e in (*s.credentials.env, *s.credentials.settings_env)
    ]
    for container in _engine_pod(_render(doc))["containers"]:
        names = [e["name"] for e in container["env"]]
        assert [n for n in names if n in expected] == expected, container["name"]


@pytest.mark.parametrize("scheme", SCHEMES, ids=_by_name)
def test_a_secret_is_named_by_a_field_of_spec_credentials(scheme: Scheme) -> None:
    fields = {f.alias or name for name, f in Credentials.model_fields.items()}
    if scheme.credentials.kind in (CredentialsKind.SECRET, CredentialsKind.SECRET_KEY):
        assert scheme.credentials.field in fields and scheme.credentials.env
    else:
        assert not (scheme.credentials.field or scheme.credentials.env or scheme.credentials.settings_env)


def test_the_renderer_mounts_every_mounted_scheme() -> None:
    assert sorted(s.name for s in source_access.MOUNTS) == sorted(
        s.name for s in SCHEMES if s.delivery is Delivery.MOUNTED
    ), "a mounted scheme needs its volume in render/source_access.py MOUNTS"


@pytest.mark.parametrize("scheme", SCHEMES, ids=_by_name)
def test_an_adapter_source_is_mounted_only_when_its_entry_says(scheme: Scheme, example_doc: dict[str, Any]) -> None:
    pod = _engine_pod(_render(_with_sources(example_doc, adapter=scheme.adapter.example)))
    baseline = _engine_pod(_render(_with_sources(example_doc, adapter="hf://acme/llama3-sql-lora")))
    added = [v for v in pod["volumes"] if v not in baseline["volumes"]]
    if scheme.delivery is not Delivery.MOUNTED:
        assert added == []
        return
    authority, _ = scheme.split(scheme.adapter.example)
    assert [v["name"] for v in added] == [f"{scheme.name}-{authority}"]
    root = source_access.MOUNTS[scheme].root
    for container in pod["containers"]:  # vLLM and the sidecar, which copies from the mount
        mount = {"name": added[0]["name"], "mountPath": f"{root}/{authority}", "readOnly": True}
        assert mount in container["volumeMounts"], container["name"]


@pytest.mark.parametrize("scheme", _BASE_MODEL_SCHEMES, ids=_by_name)
def test_a_base_model_reaches_vllm_as_its_entry_says(scheme: Scheme, example_doc: dict[str, Any]) -> None:
    assert scheme.base_model is not None
    source = scheme.base_model.rule.example
    pod = _engine_pod(_render(_with_sources(example_doc, base_model=source)))
    vllm = pod["containers"][0]
    arg = {
        ModelArg.AFTER_PREFIX: scheme.after_prefix(source),
        ModelArg.URI: source,
        ModelArg.MOUNT_PATH: f"{source_access.BASE_MODEL_MOUNT}/{scheme.split(source)[1]}".rstrip("/"),
    }[scheme.base_model.model_arg]
    assert vllm["args"][0] == arg
    load_format = scheme.base_model.load_format
    assert ("--load-format" in vllm["args"]) == (load_format is not None)
    if load_format is not None:
        assert vllm["args"][vllm["args"].index("--load-format") + 1] == load_format
    volumes = [v["name"] for v in pod["volumes"]]
    mounted = scheme.delivery is Delivery.MOUNTED
    assert (source_access.BASE_MODEL_VOLUME in volumes) == mounted
    assert any(m["mountPath"] == source_access.BASE_MODEL_MOUNT for m in vllm["volumeMounts"]) == mounted


# --- oci://: the reference forms, the plain-HTTP list -------------------------------------------

_DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "source",
    [
        "oci://registry.example.com/adapters/sql-coder:v1",
        "oci://127.0.0.1:5000/sql-coder:v1",
        f"oci://10.0.0.7:5000/team/sql-coder@{_DIGEST}",
        f"oci://localhost:5000/sql_coder.x:v1@{_DIGEST}",
    ],
)
def test_an_oci_reference_with_a_tag_or_a_digest_validates(source: str) -> None:
    _ADAPTER.validate_python(source)
    assert re.fullmatch(SOURCE_PATTERN, source)


@pytest.mark.parametrize(
    "source",
    [
        "oci://registry.example.com/adapters/sql-coder",  # neither a tag nor a digest: no implicit latest
        "oci://registry.example.com/Adapters/sql-coder:v1",  # repositories are lowercase
        "oci://registry.example.com/adapters/../x:v1",
        "oci://registry.example.com/x@sha256:abc",  # a digest is 64 hex digits
        "oci://registry.example.com/x:v1/extra",  # a tag has no '/'
        "oci://registry.example.com/x//y:v1",
    ],
)
def test_an_oci_reference_without_a_tag_or_digest_is_refused_with_the_form(source: str) -> None:
    assert _refusal(_ADAPTER, source) == named("oci").adapter.message  # type: ignore[union-attr]


def test_oci_plain_http_entries_must_be_hosts(example_doc: dict[str, Any]) -> None:
    doc = copy.deepcopy(example_doc)
    doc["spec"]["credentials"] = {"oci": {"plainHTTP": ["http://registry:5000"]}}
    with pytest.raises(SpecError) as err:
        parse_object(doc)
    assert "spec.credentials.oci.plainHTTP[0]: must be a registry as oci:// sources name it" in str(err.value)


def test_oci_credentials_reach_the_pod_as_the_secret_key_and_the_plain_http_list(
    example_doc: dict[str, Any],
) -> None:
    doc = copy.deepcopy(example_doc)
    doc["spec"]["credentials"] = {"oci": {"secretName": "registry", "plainHTTP": ["a:5000", "10.0.0.7:5000"]}}
    for container in _engine_pod(_render(doc))["containers"]:
        env = {e["name"]: e for e in container["env"]}
        assert env["LORAPOOL_OCI_AUTH"]["valueFrom"] == {
            "secretKeyRef": {"name": "registry", "key": ".dockerconfigjson"}
        }, container["name"]
        assert env["LORAPOOL_OCI_PLAIN_HTTP"]["value"] == "a:5000,10.0.0.7:5000"
    doc["spec"]["credentials"] = {"oci": {"plainHTTP": ["a:5000"]}}  # a registry without a login
    names = [e["name"] for c in _engine_pod(_render(doc))["containers"] for e in c["env"]]
    assert "LORAPOOL_OCI_AUTH" not in names and "LORAPOOL_OCI_PLAIN_HTTP" in names
