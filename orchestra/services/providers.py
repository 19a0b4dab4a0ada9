"""Model providers (SPEC §3): register, list, update, delete and check, keys encrypted at rest.

A provider is shared: administrators manage it, every user's workers may use it. The
API key is stored only as SecretBox ciphertext plus a masked hint (`sk-…abcd`).

Teams (SPEC §16): a provider stored with a `workspace_id` is that workspace's, managed by
its admins (`workspace_rights.require(…, Action.MANAGE)`: 404 for a non-member, 403
below `admin`) and read by its members, its audit entries in the workspace's chain; one
stored without is instance-wide, managed by ADMINISTRATOR and above as before and usable
by every workspace. Names are unique per workspace and among instance-wide providers. A
worker may use its workspace's providers and the instance-wide ones (`usable_by`); a
system node, instance-wide itself, only the instance-wide ones.
"""

from __future__ import annotations

import asyncio
import re
import unicodedata
from typing import Any

from peewee import IntegrityError

from orchestra import redaction
from orchestra.db.database import release_connection
from orchestra.db.models import Provider, SystemNode, Worker, iso, name_key, storable
from orchestra.egress import SETTING as EGRESS_SETTING
from orchestra.egress import find_refusal
from orchestra.engine.llm.base import LLMError
from orchestra.engine.llm.factory import SUPPORTED_KINDS, make_client
from orchestra.engine.llm.openai_compat import DEFAULT_BASE_URLS
from orchestra.errors import ConflictError, NotFoundError, ValidationError
from orchestra.services import audit, workspace_rights
from orchestra.services.charset import has_control
from orchestra.services.crypto import mask
from orchestra.services.provider_terms import clean_limits, clean_prices, price_view
from orchestra.services.shared import Shared
from orchestra.services.workspace_rights import Action, Caller

NAME_MAX = 128
MODEL_MAX = 256
URL_MAX = 1024
API_KEY_MAX = 4096
CHECK_TIMEOUT = 20.0

_UNSET: Any = object()


# --- field rules shared with agents.py -------------------------------------------------


def clean_name(value: str, field: str = "name", max_length: int = NAME_MAX) -> str:
    """A display name: NFKC, stripped, 1..max_length characters, no control or format
    character (charset.CONTROL_RANGES, which the OpenAPI document publishes)."""
    name = unicodedata.normalize("NFKC", value).strip()
    if not 1 <= len(name) <= max_length:
        raise ValidationError.field(field, f"must be 1 to {max_length} characters long")
    if has_control(name):
        raise ValidationError.field(field, "must not contain control or format characters")
    return name


def clean_text(value: str, field: str, max_length: int = 100_000) -> str:
    """Free text (descriptions, prompts): at most max_length characters, no NUL."""
    if len(value) > max_length:
        raise ValidationError.field(field, f"must be at most {max_length} characters long")
    if not storable(value):
        raise ValidationError.field(field, "must not contain NUL characters")
    return value


def clean_kind(value: str) -> str:
    if value not in SUPPORTED_KINDS:
        raise ValidationError.field(
            "provider",
            f"unsupported provider kind {value!r}; supported kinds: {', '.join(SUPPORTED_KINDS)}",
        )
    return value


def clean_model(value: str, field: str = "model_id") -> str:
    model = value.strip()
    if not 1 <= len(model) <= MODEL_MAX or not storable(model):
        raise ValidationError.field(field, f"must be 1 to {MODEL_MAX} characters long, without NUL")
    return model


# The host of a base URL, stated exactly (the OpenAPI document publishes this pattern):
# an IPv4 address, a bracketed IPv6 address, or an ASCII name of letters, digits, "-" and
# "_" labels. A name that HTTP clients would read as a malformed IPv4 address (four runs of
# digits) and labels reserved by IDNA ("ab--…", the xn-- form included) are refused:
# the clients refuse them later (a 500 once), and international names are not supported.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"
_IPV6 = "(?:" + "|".join([  # RFC 3986's IPv6address
    rf"(?:{_H16}:){{6}}{_LS32}",
    rf"::(?:{_H16}:){{5}}{_LS32}",
    rf"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    rf"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    rf"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
    rf"(?:(?:{_H16}:){{0,6}}{_H16})?::",
]) + ")"
_LABEL = r"(?![A-Za-z0-9_]{2}--)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_NOT_DOTTED_DIGITS = r"(?![0-9]+[^0-9][0-9]+[^0-9][0-9]+[^0-9][0-9]+(?:[:/?#\s]|$))"
_NAME = rf"{_NOT_DOTTED_DIGITS}{_LABEL}(?:\.{_LABEL})*\.?"
_PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})"
_WS = r"[\s\u001c-\u001f\u0085]"
_REST = r"[^\s\u0000-\u001f\u007f-\u009f]"
BASE_URL_PATTERN = (
    rf"^{_WS}*(?:[hH][tT][tT][pP][sS]?://(?:{_IPV4}(?=[:/?#]|{_WS}*$)|\[{_IPV6}\]|{_NAME})"
    rf"(?::{_PORT})?(?:[/?#]{_REST}*)?)?{_WS}*$"
)
BASE_URL = re.compile(BASE_URL_PATTERN)


def clean_base_url(value: str | None) -> str | None:
    """A provider's base URL (None for blank): see BASE_URL_PATTERN; 422 otherwise."""
    if value is None or not value.strip():
        return None
    if len(value) > URL_MAX or BASE_URL.search(value) is None:
        raise ValidationError.field(
            "base_url", "must be an http:// or https:// URL whose host is an IP address or an "
            "ASCII host name (letters, digits, - and _), with an optional port up to 65535")
    return value.strip().rstrip("/")


def clean_api_key(value: str | None) -> str | None:
    if value is None or not value.strip():
        return None
    key = value.strip()
    # It travels in an HTTP header: printable ASCII only (anything else cannot be sent).
    if len(key) > API_KEY_MAX or not all("!" <= ch <= "~" for ch in key):
        raise ValidationError.field(
            "api_key", f"must be at most {API_KEY_MAX} printable ASCII characters, without spaces"
        )
    return key


# --- views --------------------------------------------------------------------------------


def provider_view(provider: Provider) -> dict[str, Any]:
    """The API shape of a provider; the key only ever appears masked."""
    return {
        "provider_id": provider.id,
        "id": provider.id,
        "name": provider.name,
        "workspace_id": provider.workspace_id,
        "provider": provider.kind,
        "model_id": provider.model_id,
        "base_url": provider.base_url,
        "api_key": provider.api_key_hint,
        "has_api_key": provider.api_key_encrypted is not None,
        **price_view(provider.kind, provider.model_id, provider.base_url, provider.prices),
        "limits": provider.limits,
        "created_at": iso(provider.created_at),
    }


def decrypt_api_key(core: Shared, provider: Provider) -> str | None:
    """The plain key, or None; ValueError when the server secret changed since storing it."""
    if provider.api_key_encrypted is None:
        return None
    key = core.secrets.decrypt(provider.api_key_encrypted)
    redaction.remember_credentials([key])
    return key


async def providers_by_id(core: Shared, ids: set[str]) -> dict[str, Provider]:
    """The providers of these ids (for views naming a worker's or node's provider)."""
    if not ids:
        return {}
    rows = await core.db.list(Provider.select().where(Provider.id.in_(list(ids))))
    return {p.id: p for p in rows}


# --- workspaces (SPEC §16) -------------------------------------------------------------


async def scope_of(core: Shared, caller: Caller, workspace_id: str | None,
                   action: Action = Action.MANAGE) -> str | None:
    """Where a caller acts on providers: `workspace_id`'s (404 for a non-member, 403
    naming the least role below `action`'s: `admin` to manage, any member to read), else
    the instance-wide ones (managing them needs ADMINISTRATOR and above, 403 else; every
    user reads them)."""
    return await workspace_rights.instance_or_workspace(core, caller, workspace_id, action)


def _in(workspace_id: str | None) -> Any:
    return workspace_rights.of_scope(Provider.workspace_id, workspace_id)


def usable_by(workspace_id: str | None) -> Any:
    """The providers a resource of `workspace_id` may use (None: an instance-wide one,
    such as a system node): the instance-wide ones and, given one, its workspace's own."""
    reach = Provider.workspace_id.is_null()
    return reach if workspace_id is None else reach | (Provider.workspace_id == workspace_id)


# --- operations -------------------------------------------------------------------------


def audited_fields(provider: Provider) -> dict[str, Any]:
    """What an audit entry shows of a provider's change (SPEC §16; instance-level): its
    key only as "***" (`api_key_change`)."""
    return {"name": provider.name, "provider": provider.kind, "model_id": provider.model_id,
            "base_url": provider.base_url, "prices": provider.prices, "limits": provider.limits}


def _target(provider: Provider) -> dict[str, Any]:
    return audit.target("provider", provider.id, provider.name)


def _name_taken(name: str, workspace_id: str | None = None) -> ConflictError:
    where = " in this workspace" if workspace_id else " among the instance-wide providers"
    return ConflictError(f"A provider named '{name}' already exists{where} (names ignore case).")


async def _ensure_name_free(core: Shared, name: str, *, workspace_id: str | None = None,
                            except_id: str | None = None) -> None:
    """A friendly early 409 (in `workspace_id`, else among the instance-wide providers);
    the partial unique indexes on `name_key` are what decide under races."""
    query = Provider.select(Provider.id).where((Provider.name_key == name_key(name)) & _in(workspace_id))
    if except_id is not None:
        query = query.where(Provider.id != except_id)
    if await core.db.exists(query):
        raise _name_taken(name, workspace_id)


def _check_shape(kind: str, base_url: str | None) -> None:
    if kind == "openai_compatible" and base_url is None:
        raise ValidationError.field("base_url", "is required for the provider kind openai_compatible")


async def _check_egress(core: Shared, kind: str, base_url: str | None) -> None:
    """422 naming base_url and ORCHESTRA_EGRESS_ALLOW when the egress rule refuses the
    URL the provider would be called at (the kind's default when base_url is null)."""
    url = base_url or DEFAULT_BASE_URLS.get(kind)
    refusal = await core.settings.egress.url_refusal(url) if url else None
    if refusal:
        what = "" if base_url else f"(the default of {kind}, {url}) "
        problem = f"{what}is refused: {refusal}"
        raise ValidationError(f"base_url: {problem}", detail=[
            {"field": "base_url", "problem": problem, "setting": EGRESS_SETTING}])


def _keep_key_check(provider: Provider, base_url: str | None) -> None:
    """A stored key goes only to the URL it was entered for: a new base_url needs the
    key sent again (or removed), else 422 naming api_key."""
    if provider.api_key_encrypted is not None and base_url != provider.base_url:
        raise ValidationError.field(
            "api_key", "must be sent again (or null to remove it) when base_url changes: "
            "the stored key goes only to the URL it was entered for")


async def create_provider(
    core: Shared,
    *,
    name: str,
    kind: str,
    model_id: str,
    api_key: str | None = None,
    base_url: str | None = None,
    created_by: str | None = None,
    prices: Any = None,
    limits: Any = None,
    workspace_id: str | None = None,
) -> Provider:
    """Register a provider (in `workspace_id`, else instance-wide; the caller's right is
    `scope_of`'s); 422 for a bad field, 409 for a name taken there."""
    name = clean_name(name)
    prices, limits = clean_prices(prices), clean_limits(limits)
    kind = clean_kind(kind)
    model_id = clean_model(model_id)
    base_url = clean_base_url(base_url)
    api_key = clean_api_key(api_key)
    _check_shape(kind, base_url)
    await _check_egress(core, kind, base_url)
    await _ensure_name_free(core, name, workspace_id=workspace_id)
    if api_key:
        redaction.remember_credentials([api_key])
    try:
        async with core.write_transaction():
            provider = await Provider.acreate(
                name=name,
                kind=kind,
                model_id=model_id,
                base_url=base_url,
                api_key_encrypted=core.secrets.encrypt(api_key) if api_key else None,
                api_key_hint=mask(api_key) if api_key else None,
                prices=prices,
                limits=limits,
                created_by=created_by,
                workspace_id=workspace_id,
            )
            changes = audit.diff({}, audited_fields(provider))
            if api_key:
                changes["api_key"] = audit.change(None, api_key, secret=True)
            await audit.record(core, action="provider.create", target=_target(provider), changes=changes,
                               workspace_id=workspace_id)
    except IntegrityError:  # the unique name_key index: a concurrent create took the name
        raise _name_taken(name, workspace_id) from None
    core.caches.changed("provider")
    return provider


async def list_providers(core: Shared, workspace_id: str | None = None) -> list[Provider]:
    """`workspace_id`'s providers, else the instance-wide ones, oldest first."""
    return await core.db.list(Provider.select().where(_in(workspace_id))
                              .order_by(Provider.created_at, Provider.id))


async def get_provider(core: Shared, provider_id: str,
                      workspace_id: str | None = workspace_rights.EVERY_SCOPE) -> Provider:
    """The provider of that id; given `workspace_id`, only one of that workspace (None:
    an instance-wide one): any other is 404, like a missing one."""
    return await workspace_rights.one_in_scope(Provider, provider_id, workspace_id, "provider")


async def find_provider(core: Shared, name_or_id: str, workspace_id: str | None = None) -> Provider:
    """A provider a resource of `workspace_id` may use (`usable_by`; None: the
    instance-wide ones), by id or by name (case-insensitive; the workspace's first)."""
    if not storable(name_or_id):
        raise NotFoundError(f"No provider is named or has the id '{name_or_id}'.")
    reach = usable_by(workspace_id)
    provider = await Provider.aget_or_none((Provider.id == name_or_id) & reach)
    if provider is None:
        rows = await core.db.list(Provider.select().where(
            (Provider.name_key == name_key(name_or_id.strip())) & reach))
        rows.sort(key=lambda row: row.workspace_id is None)  # the workspace's own first
        provider = rows[0] if rows else None
    if provider is None:
        raise NotFoundError(f"No provider is named or has the id '{name_or_id}'.")
    return provider


async def update_provider(
    core: Shared,
    *,
    provider_id: str,
    name: str = _UNSET,
    model_id: str = _UNSET,
    api_key: str | None = _UNSET,
    base_url: str | None = _UNSET,
    prices: Any = _UNSET,
    limits: Any = _UNSET,
    workspace_id: str | None = None,
) -> Provider:
    """Change the named fields of `workspace_id`'s provider (else an instance-wide one;
    the kind is fixed); an empty or null api_key removes it, and the masked key sent back
    as shown keeps it, while base_url is unchanged."""
    provider = await get_provider(core, provider_id, workspace_id)
    before, had_key = audited_fields(provider), provider.api_key_encrypted
    if prices is not _UNSET:
        provider.prices = clean_prices(prices)
    if limits is not _UNSET:
        provider.limits = clean_limits(limits)
    if name is not _UNSET:
        provider.name = clean_name(name)
        await _ensure_name_free(core, provider.name, workspace_id=provider.workspace_id, except_id=provider.id)
    if model_id is not _UNSET:
        provider.model_id = clean_model(model_id)
    kept = api_key is _UNSET or (
        api_key is not None and provider.api_key_hint is not None and api_key == provider.api_key_hint)
    if base_url is not _UNSET:
        base_url = clean_base_url(base_url)
        if kept:
            _keep_key_check(provider, base_url)
        provider.base_url = base_url
    if not kept:
        key = clean_api_key(api_key)
        if key:
            redaction.remember_credentials([key])
        provider.api_key_encrypted = core.secrets.encrypt(key) if key else None
        provider.api_key_hint = mask(key) if key else None
    _check_shape(provider.kind, provider.base_url)
    if base_url is not _UNSET:
        await _check_egress(core, provider.kind, provider.base_url)
    changes = audit.diff(before, audited_fields(provider))
    if not kept and (had_key is not None or provider.api_key_encrypted is not None):
        changes["api_key"] = audit.change(had_key, provider.api_key_encrypted, secret=True)
    return await _save_update(core, provider, changes)


async def _save_update(core: Shared, provider: Provider, changes: dict[str, Any]) -> Provider:
    """Save a changed provider and its audit entry in one transaction (SPEC §16)."""
    try:
        async with core.write_transaction():
            if not await provider.asave():
                raise NotFoundError(f"No provider has the id '{provider.id}'.")  # deleted meanwhile
            await audit.record(core, action="provider.update", target=_target(provider), changes=changes,
                               workspace_id=provider.workspace_id)
    except IntegrityError:  # the unique name_key index: a concurrent rename took the name
        raise _name_taken(provider.name, provider.workspace_id) from None
    core.caches.changed("provider")
    return provider


async def delete_provider(core: Shared, *, provider_id: str, workspace_id: str | None = None) -> Provider:
    """Delete a provider (`workspace_id`'s, else an instance-wide one) no worker or system
    node uses; 409 naming the users otherwise."""
    async with core.write_transaction():
        provider = await get_provider(core, provider_id, workspace_id)
        workers = await core.db.list(
            Worker.select(Worker.id, Worker.name)
            .where(Worker.provider == provider.id)
            .order_by(Worker.name)
        )
        nodes = await core.db.list(
            SystemNode.select(SystemNode.name)
            .where(SystemNode.provider == provider.id)
            .order_by(SystemNode.name)
        )
        if workers or nodes:
            users = [f"worker '{w.name}'" for w in workers] + [f"system node '{n.name}'" for n in nodes]
            raise ConflictError(
                f"Provider '{provider.name}' is in use by {', '.join(users)}; "
                "move them to another provider first.",
                detail={
                    "workers": [{"worker_id": w.id, "name": w.name} for w in workers],
                    "nodes": [n.name for n in nodes],
                },
            )
        try:
            await core.db.aexecute(Provider.delete().where(Provider.id == provider.id))
        except IntegrityError:  # a worker was bound to it meanwhile
            raise ConflictError(
                f"Provider '{provider.name}' is in use by a worker; try again."
            ) from None
        changes = audit.diff(audited_fields(provider), {})
        if provider.api_key_encrypted is not None:
            changes["api_key"] = audit.change(provider.api_key_encrypted, None, secret=True)
        await audit.record(core, action="provider.delete", target=_target(provider), changes=changes,
                           workspace_id=provider.workspace_id)
    core.caches.changed("provider")
    return provider


def _check_error(name: str, err: LLMError) -> str:
    """Why a check failed, in one sentence of ours: never the provider's body (a URL
    pointed at an internal service would otherwise read it back)."""
    refused = find_refusal(err)
    if refused is not None or "egress rule" in err.message:
        return f"Provider '{name}' was not called: {refused or err.message.split(': ', 1)[-1]}"
    status = err.status
    if status is None:
        if "not the JSON" in err.message:
            return f"Provider '{name}' answered, but not with a model list; check its base_url."
        if "timeout" in err.message:
            return f"Provider '{name}' did not answer within the check's time limit."
        return f"Provider '{name}' could not be reached; check its base_url and that it is up."
    if status in (401, 403):
        return f"Provider '{name}' refused the API key (HTTP {status}); check the key."
    if status == 404:
        return f"Provider '{name}' has no model list at its base_url (HTTP 404); check the base_url."
    if status == 429:
        return f"Provider '{name}' is limiting requests (HTTP 429); try again later."
    if status >= 500:
        return f"Provider '{name}' failed to answer (HTTP {status}); try again later."
    return f"Provider '{name}' refused the request (HTTP {status})."


async def check_provider(core: Shared, *, provider_id: str, workspace_id: str | None = None) -> dict[str, Any]:
    """Ask the provider (`workspace_id`'s, else an instance-wide one) for its models with
    the stored key and URL: `{ok: true, models}`, or `{ok: false, error}` when it cannot
    be reached or refuses (SPEC §3); 404 only for an unknown provider."""
    provider = await get_provider(core, provider_id, workspace_id)
    try:
        api_key = decrypt_api_key(core, provider)
    except ValueError:
        return {"ok": False, "error": (
            f"The API key of provider '{provider.name}' cannot be decrypted (the server "
            "secret changed); store the key again.")}
    timeout = min(core.settings.llm_timeout, CHECK_TIMEOUT)
    # The provider may take CHECK_TIMEOUT seconds: hold no store connection meanwhile,
    # and build the client (imports and TLS set-up) off the event loop.
    await release_connection(core.db)
    client = None
    try:
        try:
            client = await asyncio.to_thread(
                make_client, kind=provider.kind, api_key=api_key, base_url=provider.base_url,
                timeout=timeout, egress=core.settings.egress,
            )
        except LLMError as err:  # our own refusal (e.g. an anthropic provider without a key)
            return {"ok": False, "error": f"Provider '{provider.name}' cannot be used: {err.message}"}
        return {"ok": True, "models": sorted(await client.list_models())}
    except LLMError as err:
        return {"ok": False, "error": _check_error(provider.name, err)}
    except Exception as err:  # a base_url stored before hosts were checked: InvalidURL of
        # httpx (or of the anthropic SDK's own HTTP package), or idna's ValueError
        if not (isinstance(err, ValueError) or type(err).__name__ == "InvalidURL"):
            raise
        return {"ok": False, "error": (
            f"Provider '{provider.name}' cannot be reached: its base_url is not a usable "
            "URL; update the base_url.")}
    finally:
        if client is not None:
            await client.aclose()
