"""The source schemes models and adapters are read from: one table, one entry per scheme. Pure.

An entry says everything lorapool knows about its scheme: the URI schemes it takes, its URI
pattern and readable rule (for an adapter and, when it may serve one, for a base model), where
its credentials come from, how its files reach the engine pod, and what vLLM is given as the
model. Every caller reads this table instead of spelling a scheme out itself:

* ``lorapool.api.common``: the readable rules of ``spec.adapters[].source`` and
  ``spec.baseModel.source`` (the CRD's CEL rules, same words) and the adapter set's wire pattern;
* ``lorapool.sources.registry``: which Source opens each entry, and the schemes an unknown one is
  told to use;
* ``lorapool.render.source_access``: the credentials env of the engine pod, a volume per mounted
  source, vLLM's model argument and load format.

Adding a scheme (the last was ``oci://``) is one entry here and its Source class in ``lorapool.sources``
(with its line in ``sources/registry.py``); ``tests/api/test_schemes.py`` fails until the
validation, the registry and the renderer all know it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Delivery(StrEnum):
    """How a scheme's files reach the engine pod."""

    # Fetched over the network by a process in the pod: the sidecar's Source for an adapter,
    # vLLM itself for a base model. Nothing is rendered for them but credentials.
    DOWNLOADED = "downloaded"
    # A volume the renderer adds to the engine pod: vLLM reads a base model in place, the sidecar
    # copies an adapter from the mount (``SourceOptions.pvc_root``).
    MOUNTED = "mounted"
    # Already on the container's filesystem (in the image, or a volume the user adds through
    # spec.vllm): nothing is rendered; the sidecar copies an adapter, vLLM reads a base model.
    LOCAL = "local"


class CredentialsKind(StrEnum):
    """Where a scheme's credentials come from."""

    NONE = "none"  # none: a local path, or a claim the pod mounts
    URL = "url"  # basic auth in the URL itself (https://user:password@host/...), redacted in every message
    SECRET_KEY = "secret-key"  # one key of a Secret the pool names (name and key), as one env var
    SECRET = "secret"  # a Secret the pool names, with fixed keys, each the env var of the same name


class ModelArg(StrEnum):
    """What ``vllm serve`` is given as its model for a base model of a scheme."""

    AFTER_PREFIX = "after-prefix"  # the source without its prefix: hf://org/repo -> org/repo, file:///abs -> /abs
    URI = "uri"  # the source as written: vLLM streams it (see ``BaseModelUse.load_format``)
    MOUNT_PATH = "mount-path"  # the path inside the mounted claim, under the base model's mount


@dataclass(frozen=True)
class UriRule:
    """A readable rule for one scheme's sources: ``regex`` (RE2 and Python alike) must match a value
    starting with ``when``; ``message`` says what a valid one looks like and ends with ``example``.
    ``lorapool.api.common`` turns it into a ``Check``, the CRD into a CEL rule with the same words."""

    regex: str
    message: str
    when: str
    example: str


@dataclass(frozen=True)
class CredentialsFrom:
    """Where a scheme's credentials come from, and the env vars the engine pod's vLLM and sidecar
    containers get them as (``lorapool.render.source_access``)."""

    kind: CredentialsKind
    field: str = ""  # the spec.credentials field that names the Secret (and its settings)
    env: tuple[str, ...] = ()  # env vars taken from the Secret's keys
    settings_env: tuple[str, ...] = ()  # env vars given plain values from the same field's settings


@dataclass(frozen=True)
class BaseModelUse:
    """How a scheme serves as ``spec.baseModel.source``."""

    rule: UriRule
    uri_pattern: str  # unanchored; ``BASE_MODEL_SOURCE_PATTERN`` joins them
    model_arg: ModelArg
    load_format: str | None = None  # vLLM --load-format the scheme needs; None: vLLM's default


@dataclass(frozen=True)
class Scheme:
    """One source scheme. ``name`` is how messages print it (``https://``); ``uri_schemes`` every URI
    scheme the entry takes, lowercase as ``urlsplit`` gives them (https also takes http)."""

    name: str
    uri_schemes: tuple[str, ...]
    scheme_regex: str  # its alternative in the "must start with" rule: https? for https and http
    uri_pattern: str  # unanchored, looser than ``adapter``: what the adapter set's wire contract accepts
    adapter: UriRule  # the rule for spec.adapters[].source
    base_model: BaseModelUse | None  # None: not a base-model source
    delivery: Delivery
    credentials: CredentialsFrom

    @property
    def prefix(self) -> str:
        return f"{self.name}://"

    @property
    def prefixes(self) -> tuple[str, ...]:
        return tuple(f"{scheme}://" for scheme in self.uri_schemes)

    def owns(self, source: str) -> bool:
        """Whether ``source`` starts with one of this entry's prefixes (case-sensitive, as validated)."""
        return source.startswith(self.prefixes)

    def after_prefix(self, source: str) -> str:
        """``source`` without this entry's prefix: ``pvc://claim/a/b`` -> ``claim/a/b``."""
        for prefix in self.prefixes:
            if source.startswith(prefix):
                return source.removeprefix(prefix)
        return source

    def split(self, source: str) -> tuple[str, str]:
        """The authority (claim, bucket, org) and the path after it: ``pvc://claim/a/b`` -> ``("claim", "a/b")``."""
        authority, _, path = self.after_prefix(source).partition("/")
        return authority, path


_S3_RULE = UriRule(
    r"^s3://[a-z0-9][-a-z0-9.]{1,61}[a-z0-9](/.*)?$",
    "an s3:// source is s3://<bucket>/<prefix>, the bucket 3-63 lowercase letters, digits, '-' or '.', starting "
    "and ending with a letter or digit, e.g. s3://acme-adapters/sql-coder/",
    when="s3://",
    example="s3://acme-adapters/sql-coder/",
)
_S3_PATTERN = r"s3://[a-z0-9][-a-z0-9.]{1,62}(/.*)?"
_PVC_RULE = UriRule(
    r"^pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/.*)?$",
    "a pvc:// source is pvc://<claim>/<path>, the claim a Kubernetes name (lowercase letters, digits, '-', '.'), "
    "e.g. pvc://adapters/sql-coder",
    when="pvc://",
    example="pvc://adapters/sql-coder",
)
_PVC_PATTERN = r"pvc://[a-z0-9][-a-z0-9.]*(/.*)?"
_FILE_RULE = UriRule(
    r"^file:///",
    "a file:// source is an absolute path, e.g. file:///adapters/sql-coder",
    when="file://",
    example="file:///adapters/sql-coder",
)
_FILE_PATTERN = r"file:///.*"

HF = Scheme(
    name="hf",
    uri_schemes=("hf",),
    scheme_regex="hf",
    uri_pattern=r"hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+(@[-A-Za-z0-9_./]+)?(/.*)?",
    adapter=UriRule(
        r"^hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+(@[-A-Za-z0-9_./]+)?(/.*)?$",
        "an hf:// source is hf://<org>/<repo>, optionally @<revision> and /<subfolder>, e.g. hf://acme/llama3-sql-lora",
        when="hf://",
        example="hf://acme/llama3-sql-lora",
    ),
    base_model=BaseModelUse(
        UriRule(
            r"^hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+$",
            "an hf:// base model is hf://<org>/<repo> (its revision goes in spec.baseModel.revision), "
            "e.g. hf://meta-llama/Meta-Llama-3-8B-Instruct",
            when="hf://",
            example="hf://meta-llama/Meta-Llama-3-8B-Instruct",
        ),
        uri_pattern=r"hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+",
        model_arg=ModelArg.AFTER_PREFIX,  # the Hub id; vLLM downloads it (HF_ENDPOINT, HF_TOKEN)
    ),
    delivery=Delivery.DOWNLOADED,  # huggingface_hub (the sidecar), vLLM's own download (a base model)
    credentials=CredentialsFrom(CredentialsKind.SECRET_KEY, field="huggingFace", env=("HF_TOKEN",)),
)
S3 = Scheme(
    name="s3",
    uri_schemes=("s3",),
    scheme_regex="s3",
    uri_pattern=_S3_PATTERN,
    adapter=_S3_RULE,
    base_model=BaseModelUse(_S3_RULE, _S3_PATTERN, ModelArg.URI, load_format="runai_streamer"),
    delivery=Delivery.DOWNLOADED,  # boto3 (the sidecar), vLLM's runai_streamer (a base model)
    credentials=CredentialsFrom(
        CredentialsKind.SECRET,
        field="s3",
        env=("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
        settings_env=("AWS_ENDPOINT_URL", "AWS_REGION"),  # from spec.credentials.s3.endpoint and .region
    ),
)
HTTPS = Scheme(
    name="https",
    uri_schemes=("http", "https"),
    scheme_regex="https?",
    uri_pattern=r"https?://[^\s]+",
    adapter=UriRule(
        r"^https?://[^\s/]+\S*$",
        "an https:// source is a URL without spaces, of a .tar.gz archive or a directory, "
        "e.g. https://models.example.com/sql-coder.tar.gz",
        when="http",
        example="https://models.example.com/sql-coder.tar.gz",
    ),
    base_model=None,
    delivery=Delivery.DOWNLOADED,  # aiohttp (the sidecar)
    credentials=CredentialsFrom(CredentialsKind.URL),
)
PVC = Scheme(
    name="pvc",
    uri_schemes=("pvc",),
    scheme_regex="pvc",
    uri_pattern=_PVC_PATTERN,
    adapter=_PVC_RULE,
    base_model=BaseModelUse(_PVC_RULE, _PVC_PATTERN, ModelArg.MOUNT_PATH),
    delivery=Delivery.MOUNTED,  # the claim, read-only, in the engine pod
    credentials=CredentialsFrom(CredentialsKind.NONE),
)
FILE = Scheme(
    name="file",
    uri_schemes=("file",),
    scheme_regex="file",
    uri_pattern=_FILE_PATTERN,
    adapter=_FILE_RULE,
    base_model=BaseModelUse(_FILE_RULE, _FILE_PATTERN, ModelArg.AFTER_PREFIX),
    delivery=Delivery.LOCAL,
    credentials=CredentialsFrom(CredentialsKind.NONE),
)
# A registry (host[:port]), a repository of lowercase components joined by one '.', '_', '-' or '/' (no
# '..', so no path games on the registry's API), then a tag, a digest, or a tag with a digest (the digest
# wins). Kept this short on purpose: the API server prices a CEL rule by its regex's length times the
# source's maxLength, and a longer one (the distribution spec's exact grammar) exceeds the rule budget.
_OCI_REFERENCE = r"oci://[-A-Za-z0-9.:]+/[a-z0-9]+([-._/][a-z0-9]+)*(:[-\w.]+|(:[-\w.]+)?@sha256:[a-f0-9]{64})"
OCI = Scheme(
    name="oci",
    uri_schemes=("oci",),
    scheme_regex="oci",
    uri_pattern=r"oci://[^\s/]+/[^\s]+",
    adapter=UriRule(
        f"^{_OCI_REFERENCE}$",
        "an oci:// source is oci://<registry>[:<port>]/<repository>:<tag> or @sha256:<64 hex digest>, the "
        "repository lowercase, e.g. oci://registry.example.com/adapters/sql-coder:v1",
        when="oci://",
        example="oci://registry.example.com/adapters/sql-coder:v1",
    ),
    base_model=None,
    delivery=Delivery.DOWNLOADED,  # the distribution API over aiohttp (the sidecar, lorapool.sources.oci)
    # spec.credentials.oci: the .dockerconfigjson key of a kubernetes.io/dockerconfigjson Secret, and
    # the registries reached over plain HTTP (a comma-separated list).
    credentials=CredentialsFrom(
        CredentialsKind.SECRET_KEY,
        field="oci",
        env=("LORAPOOL_OCI_AUTH",),
        settings_env=("LORAPOOL_OCI_PLAIN_HTTP",),
    ),
)

SCHEMES: tuple[Scheme, ...] = (HF, S3, HTTPS, PVC, FILE, OCI)
"""Every scheme, in the order validation lists them (``must start with hf://, s3://, ...``)."""

BASE_MODEL_SCHEMES: tuple[Scheme, ...] = tuple(s for s in SCHEMES if s.base_model is not None)


def scheme_of(source: str) -> Scheme | None:
    """The entry whose prefix ``source`` starts with (case-sensitive, as validation reads it); None if none."""
    return next((s for s in SCHEMES if s.owns(source)), None)


def named(uri_scheme: str) -> Scheme | None:
    """The entry that takes URI scheme ``uri_scheme`` (``http`` -> ``HTTPS``); None for an unknown one."""
    return next((s for s in SCHEMES if uri_scheme in s.uri_schemes), None)
