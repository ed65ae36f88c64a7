"""Per-call settings for ``s3://`` paths (``Options(s3=S3Settings(...))``).

Without them an ``s3://bucket/prefix`` path is configured the way the AWS
tools are: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` and ``AWS_PROFILE`` with
``~/.aws/credentials`` and ``~/.aws/config``. Each field set here wins over
those, so one program can use several stores. docs/S3.md has the details.
"""

from __future__ import annotations

import dataclasses

from .errors import InvalidArgumentError

_HIDDEN = "<hidden>"


@dataclasses.dataclass(frozen=True, repr=False)
class S3Settings:
    """Where and as whom ``s3://`` paths are reached; None fields come from
    the environment and the AWS files.

    Attributes:
      endpoint_url: the server, e.g. "http://127.0.0.1:8333" or
        "https://storage.googleapis.com"; None is AWS itself. Custom
        endpoints are addressed path-style (``<endpoint>/<bucket>/<key>``).
      region: the signing region ("us-east-1"; "auto" for GCS).
      access_key_id, secret_access_key: static credentials (both or none).
      session_token: for temporary credentials, with the two above.
      profile: a profile of ``~/.aws/credentials`` and ``~/.aws/config``.

    The secret and the session token never appear in the repr (nor in any
    shardkeep error or log).
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    profile: str | None = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            if not isinstance(value, str) or not value:
                shown = _HIDDEN if field.name in _SECRET_FIELDS else repr(value)
                raise InvalidArgumentError(
                    f"S3Settings.{field.name} must be a non-empty str or None, got {shown}")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise InvalidArgumentError(
                "S3Settings takes access_key_id and secret_access_key together")
        if self.session_token is not None and self.access_key_id is None:
            raise InvalidArgumentError(
                "S3Settings.session_token needs access_key_id and secret_access_key")
        if self.endpoint_url is not None and not self.endpoint_url.startswith(
                ("http://", "https://")):
            raise InvalidArgumentError(
                "S3Settings.endpoint_url must start with http:// or https://, got "
                f"{self.endpoint_url!r}")

    def __repr__(self) -> str:
        shown = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            shown.append(f"{field.name}="
                         f"{_HIDDEN if field.name in _SECRET_FIELDS else repr(value)}")
        return f"S3Settings({', '.join(shown)})"

    def to_core(self):
        """The equivalent ``shardkeep._core.S3Overrides``."""
        from . import _core  # Imported late so that this module stays importable alone.

        overrides = _core.S3Overrides()
        for field in dataclasses.fields(self):
            setattr(overrides, field.name, getattr(self, field.name))
        return overrides


_SECRET_FIELDS = frozenset({"secret_access_key", "session_token"})
