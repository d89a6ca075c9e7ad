"""A local Hugging Face Hub for tests: enough of the Hub's HTTP API, on 127.0.0.1, that huggingface_hub's own
client code (and transformers' `push_to_hub` / `from_pretrained` over it) runs unchanged against it.

Served, as the client of huggingface_hub 2.x calls it (read from its source, `hf_api.py`, `_commit_api.py`,
`lfs.py`, `file_download.py`):

- `POST /api/repos/create`, `GET /api/whoami-v2`, `POST /api/validate-yaml`;
- `POST /api/models/{repo}/preupload/{rev}` (upload mode per file: LFS for the paths the repo's `.gitattributes`
  marks `filter=lfs`, for binary samples and for files of 10 MiB or more, as the Hub decides),
  `POST /{repo}.git/info/lfs/objects/batch` (git-lfs batch API, "basic" transfer), `PUT` of the object to the
  href it returns (the sha256 and size are checked), the LFS verify call, and
  `POST /api/models/{repo}/commit/{rev}` (the NDJSON commit: header, file, lfsFile, deletedFile,
  deletedFolder; `parentCommit` checked);
- `POST /api/models/{repo}/branch/{name}`, `POST /api/models/{repo}/tag/{rev}`, `GET /api/models/{repo}/refs`;
- `GET /api/models/{repo}[/revision/{rev}]` (model info with siblings), `GET /api/models/{repo}/tree/{rev}[/path]`,
  `POST /api/models/{repo}/paths-info/{rev}`;
- `HEAD` / `GET /{repo}/resolve/{rev}/{path}` with `X-Repo-Commit`, `ETag` (git blob sha1), and for LFS files
  a 302 to the object's URL with `X-Linked-Etag` (sha256) and `X-Linked-Size`, as the Hub redirects to its CDN;
  `Range` requests; the Hub's `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound) on misses.

Writes need `Authorization: Bearer <token>` of the one user (`LocalHub.user`), in that user's namespace;
private repos are read with it only. Not served (the client is configured so it does not need them): Xet
storage (the tests set `HF_HUB_DISABLE_XET=1`, so large files go through git-lfs), pull requests, multipart LFS,
spaces and datasets, organisations, gated repos. Commits are kept in memory as file maps (no git objects).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

LFS_THRESHOLD = 10 * 1024 * 1024
# the `.gitattributes` the Hub writes into every new model repo (its LFS part, the patterns a checkpoint uses)
DEFAULT_GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in ("*.bin", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.pt", "*.pth", "*.safetensors", "*.zip")
)


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Blob:
    data: bytes
    lfs: bool

    @property
    def oid(self) -> str:
        """The id `preupload` reports and the client compares with its file: sha256 for LFS, git sha1 otherwise."""
        return hashlib.sha256(self.data).hexdigest() if self.lfs else git_blob_sha1(self.data)

    @property
    def pointer(self) -> bytes:
        sha = hashlib.sha256(self.data).hexdigest()
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(self.data)}\n".encode()

    def entry(self, path: str) -> dict:
        """One file of the tree / paths-info API."""
        entry = {"type": "file", "path": path, "size": len(self.data)}
        if self.lfs:
            pointer = self.pointer
            entry["oid"] = git_blob_sha1(pointer)
            entry["lfs"] = {"oid": hashlib.sha256(self.data).hexdigest(), "size": len(self.data)}
            entry["lfs"]["pointerSize"] = len(pointer)
        else:
            entry["oid"] = git_blob_sha1(self.data)
        return entry


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: dict[str, dict[str, Blob]] = field(default_factory=dict)  # sha -> path -> blob
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)  # sha -> commit summary

    def commit(self, parent: str | None, files: dict[str, Blob], message: str) -> str:
        listing = {path: blob.oid for path, blob in sorted(files.items())}
        sha = hashlib.sha1(json.dumps([parent, message, listing]).encode()).hexdigest()
        self.commits[sha] = dict(files)
        self.messages[sha] = message
        return sha

    def resolve(self, revision: str) -> str | None:
        if revision in self.branches:
            return self.branches[revision]
        if revision in self.tags:
            return self.tags[revision]
        return revision if revision in self.commits else None


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, commit: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.commit = status, message, code, commit


class LocalHub:
    """The Hub's state (repos, LFS objects) and its HTTP server; `start()` serves on 127.0.0.1 at a free port."""

    def __init__(self, user: str = "zpx-tester", token: str = "hf_LocalHubTestToken0123456789abcdef"):
        self.user, self.token = user, token
        self.repos: dict[str, Repo] = {}
        self.lfs_objects: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, in order
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.storage: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def storage_url(self) -> str:
        # the same loopback server under another host name: huggingface_hub < 2 tells hosts apart by name only
        return f"http://localhost:{self.storage.server_address[1]}"

    def start(self) -> LocalHub:
        """Serve the API, and LFS objects on a second port named `localhost`: another host, as the Hub's CDN is, so
        the client takes a file's metadata from the redirect and does not follow it with the token."""
        self.server, self.storage = (ThreadingHTTPServer(("127.0.0.1", 0), _Handler) for _ in range(2))
        for server, storage in ((self.server, False), (self.storage, True)):
            server.daemon_threads, server.hub, server.is_storage = True, self, storage
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        for server in (self.server, self.storage):
            server.shutdown()
            server.server_close()

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """The repo's files at `revision` (for assertions)."""
        repo = self.repos[repo_id]
        return {path: blob.data for path, blob in repo.commits[repo.resolve(revision)].items()}

    # --- the API, one method per route; `request` carries method, segments, query, headers, body -------------

    def _user_of(self, headers) -> str | None:
        auth = headers.get("Authorization", "")
        return self.user if auth == f"Bearer {self.token}" else None

    def _writable(self, request, namespace: str) -> None:
        user = self._user_of(request.headers)
        if user is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        if namespace != user:
            raise HubError(403, f"You don't have the rights to create a model under the namespace {namespace!r}")

    def _repo(self, request, repo_id: str, write: bool = False) -> Repo:
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and self._user_of(request.headers) is None):
            raise HubError(404, "Repository not found", "RepoNotFound")
        if write:
            self._writable(request, repo_id.split("/")[0])
        return repo

    def _commit(self, repo: Repo, revision: str) -> str:
        sha = repo.resolve(revision)
        if sha is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return sha

    def create_repo(self, request) -> tuple[int, dict]:
        payload = json.loads(request.body)
        if payload.get("type", "model") != "model":
            raise HubError(400, f"repo type {payload['type']!r} is not served by the local Hub")
        namespace = payload.get("organization") or self._user_of(request.headers) or "anonymous"
        self._writable(request, namespace)
        repo_id = f"{namespace}/{payload['name']}"
        url = f"{self.url}/{repo_id}"
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo", "url": url}
        repo = Repo(repo_id, private=bool(payload.get("private")))
        attributes = Blob(DEFAULT_GITATTRIBUTES.encode(), lfs=False)
        repo.branches["main"] = repo.commit(None, {".gitattributes": attributes}, "initial commit")
        self.repos[repo_id] = repo
        return 200, {"url": url, "name": repo_id}

    def whoami(self, request) -> tuple[int, dict]:
        if self._user_of(request.headers) is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        return 200, {"type": "user", "name": self.user, "orgs": [], "auth": {"accessToken": {"role": "write"}}}

    def validate_yaml(self, request) -> tuple[int, dict]:
        content = json.loads(request.body)["content"]
        if content.startswith("---"):
            try:
                metadata = yaml.safe_load(content.split("---", 2)[1])
            except yaml.YAMLError as error:
                return 400, {"errors": [{"message": f"invalid YAML: {error}"}], "warnings": []}
            if metadata is not None and not isinstance(metadata, dict):
                return 400, {"errors": [{"message": "metadata must be a mapping"}], "warnings": []}
        return 200, {"errors": [], "warnings": []}

    def preupload(self, request, repo_id: str, revision: str) -> tuple[int, dict]:
        repo = self._repo(request, repo_id, write=True)
        files = repo.commits[self._commit(repo, revision)]
        payload = json.loads(request.body)
        attributes = files.get(".gitattributes", Blob(b"", False)).data.decode()
        lfs_patterns = [line.split()[0] for line in attributes.splitlines() if "filter=lfs" in line]
        ignored = [line.strip() for line in payload.get("gitIgnore", "").splitlines() if line.strip()]
        answer = []
        for item in payload["files"]:
            path, sample = item["path"], base64.b64decode(item["sample"])
            name = path.rsplit("/", 1)[-1]
            lfs = any(fnmatch.fnmatch(name, pattern) for pattern in lfs_patterns)
            lfs = lfs or item["size"] >= LFS_THRESHOLD or b"\0" in sample
            existing = files.get(path)
            answer.append(
                {
                    "path": path,
                    "uploadMode": "lfs" if lfs else "regular",
                    "shouldIgnore": any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(name, p) for p in ignored),
                    "oid": existing.oid if existing is not None and existing.lfs == lfs else None,
                }
            )
        return 200, {"files": answer}

    def lfs_batch(self, request, repo_id: str) -> tuple[int, dict]:
        self._repo(request, repo_id, write=True)
        payload = json.loads(request.body)
        if payload.get("operation") != "upload":
            raise HubError(400, "the local Hub serves LFS uploads only (downloads go through /resolve)")
        objects = []
        for item in payload["objects"]:
            entry = {"oid": item["oid"], "size": item["size"], "authenticated": True}
            if item["oid"] not in self.lfs_objects:
                entry["actions"] = {
                    "upload": {"href": f"{self.storage_url}/_lfs/{item['oid']}", "header": {}},
                    "verify": {"href": f"{self.url}/{repo_id}.git/info/lfs/objects/verify", "header": {}},
                }
            objects.append(entry)
        return 200, {"transfer": "basic", "objects": objects}

    def lfs_put(self, request, oid: str) -> tuple[int, dict]:
        if hashlib.sha256(request.body).hexdigest() != oid:
            raise HubError(400, f"uploaded content does not have the sha256 {oid}")
        with self.lock:
            self.lfs_objects[oid] = request.body
        return 200, {}

    def lfs_verify(self, request, repo_id: str) -> tuple[int, dict]:
        self._repo(request, repo_id, write=True)
        item = json.loads(request.body)
        data = self.lfs_objects.get(item["oid"])
        if data is None or len(data) != item["size"]:
            raise HubError(404, f"LFS object {item['oid']} of size {item['size']} was not uploaded")
        return 200, {}

    def commit(self, request, repo_id: str, revision: str) -> tuple[int, dict]:
        repo = self._repo(request, repo_id, write=True)
        if request.query.get("create_pr"):
            raise HubError(400, "pull requests are not served by the local Hub")
        if revision not in repo.branches:
            raise HubError(404, f"Invalid rev id: {revision} is not a branch", "RevisionNotFound")
        lines = [json.loads(line) for line in request.body.decode().splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        with self.lock:
            parent = repo.branches[revision]
            if header.get("parentCommit") not in (None, parent):
                raise HubError(412, f"A commit has happened since. Please refresh and try again. ({parent})")
            files = dict(repo.commits[parent])
            for line in lines:
                key, value = line["key"], line["value"]
                if key == "file":
                    files[value["path"]] = Blob(base64.b64decode(value["content"]), lfs=False)
                elif key == "lfsFile":
                    data = self.lfs_objects.get(value["oid"])
                    if data is None or len(data) != value.get("size", len(data)):
                        raise HubError(422, f"Your push was rejected: LFS object {value['oid']} was not uploaded")
                    files[value["path"]] = Blob(data, lfs=True)
                elif key == "deletedFile":
                    if files.pop(value["path"], None) is None:
                        raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
                elif key == "deletedFolder":
                    prefix = value["path"].rstrip("/") + "/"
                    files = {path: blob for path, blob in files.items() if not path.startswith(prefix)}
                elif key != "header":
                    raise HubError(400, f"commit operation {key!r} is not served by the local Hub")
            sha = repo.commit(parent, files, header["summary"])
            repo.branches[revision] = sha
        return 200, {"success": True, "commitOid": sha, "commitUrl": f"{self.url}/{repo_id}/commit/{sha}"}

    def create_branch(self, request, repo_id: str, branch: str) -> tuple[int, dict]:
        repo = self._repo(request, repo_id, write=True)
        start = json.loads(request.body or b"{}").get("startingPoint", "main")
        if branch in repo.branches or branch in repo.tags:
            return 409, {"error": "Reference already exists"}
        repo.branches[branch] = self._commit(repo, start)
        return 200, {}

    def create_tag(self, request, repo_id: str, revision: str) -> tuple[int, dict]:
        repo = self._repo(request, repo_id, write=True)
        tag = json.loads(request.body)["tag"]
        if tag in repo.tags or tag in repo.branches:
            return 409, {"error": "Reference already exists"}
        repo.tags[tag] = self._commit(repo, revision)
        return 200, {}

    def refs(self, request, repo_id: str) -> tuple[int, dict]:
        repo = self._repo(request, repo_id)

        def listed(refs, kind):
            return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": sha} for n, sha in sorted(refs.items())]

        return 200, {"branches": listed(repo.branches, "heads"), "tags": listed(repo.tags, "tags"), "converts": []}

    def model_info(self, request, repo_id: str, revision: str = "main") -> tuple[int, dict]:
        repo = self._repo(request, repo_id)
        sha = self._commit(repo, revision)
        siblings = []
        for path, blob in sorted(repo.commits[sha].items()):
            sibling = {"rfilename": path}
            if request.query.get("blobs"):
                entry = blob.entry(path)
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if blob.lfs:
                    lfs = entry["lfs"]
                    sibling["lfs"] = {"sha256": lfs["oid"], "size": lfs["size"], "pointerSize": lfs["pointerSize"]}
            siblings.append(sibling)
        info = {"_id": repo_id, "id": repo_id, "modelId": repo_id, "author": repo_id.split("/")[0], "sha": sha}
        info.update(private=repo.private, gated=False, disabled=False, tags=[], siblings=siblings)
        return 200, {**info, "downloads": 0, "likes": 0, "library_name": "transformers"}

    def tree(self, request, repo_id: str, revision: str, folder: str = "", paths: list[str] | None = None):
        repo = self._repo(request, repo_id)
        files = repo.commits[self._commit(repo, revision)]
        if paths is not None:  # paths-info: exactly the paths asked for, files or folders
            folders = {p.rsplit("/", 1)[0] for p in files if "/" in p}
            folders |= {f.rsplit("/", i)[0] for f in folders for i in range(f.count("/") + 1)}
            entries = [files[p].entry(p) for p in paths if p in files]
            entries += [{"type": "directory", "path": p, "oid": "0" * 40} for p in paths if p in folders]
            return 200, entries
        prefix = folder.strip("/") + "/" if folder.strip("/") else ""
        below = {p: b for p, b in files.items() if p.startswith(prefix)}
        if prefix and not below:
            raise HubError(404, f"{folder} does not exist on {revision}", "EntryNotFound")
        if request.query.get("recursive") in ("True", "true", "1"):
            return 200, [blob.entry(p) for p, blob in sorted(below.items())]
        entries, seen = [], set()
        for path, blob in sorted(below.items()):
            rest = path[len(prefix) :]
            if "/" in rest:
                sub = prefix + rest.split("/", 1)[0]
                if sub not in seen:
                    seen.add(sub)
                    entries.append({"type": "directory", "path": sub, "oid": "0" * 40, "size": 0})
            else:
                entries.append(blob.entry(path))
        return 200, entries

    def resolve(self, request, repo_id: str, revision: str, path: str) -> tuple[int, dict, bytes]:
        repo = self._repo(request, repo_id)
        sha = self._commit(repo, revision)
        blob = repo.commits[sha].get(path)
        if blob is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", commit=sha)
        headers = {"X-Repo-Commit": sha}
        if blob.lfs:  # as the Hub: a redirect to the object's storage, the file's identity in X-Linked-*
            oid = hashlib.sha256(blob.data).hexdigest()
            headers.update({"Location": f"{self.storage_url}/_lfs/{oid}", "X-Linked-Etag": f'"{oid}"'})
            headers.update({"X-Linked-Size": str(len(blob.data)), "ETag": f'"{git_blob_sha1(blob.pointer)}"'})
            return 302, headers, b""
        return 200, {**headers, "ETag": f'"{git_blob_sha1(blob.data)}"'}, blob.data

    # --- routing -------------------------------------------------------------------------------------------

    def route(self, request) -> tuple[int, dict, bytes]:
        """(status, headers, body) for one request; JSON answers are encoded here."""
        s, m = request.segments, request.method
        try:
            if request.storage != (s[:1] == ["_lfs"] and len(s) == 2):
                raise HubError(404, f"{m} {request.path} is not served {'by storage' if request.storage else 'here'}")
            if request.storage:
                if m == "PUT":
                    return _json(*self.lfs_put(request, s[1]))
                data = self.lfs_objects.get(s[1])
                if data is None:
                    raise HubError(404, "no such LFS object")
                return 200, {"ETag": f'"{s[1]}"'}, data
            if s[:1] == ["api"]:
                if s[1:] == ["repos", "create"] and m == "POST":
                    return _json(*self.create_repo(request))
                if s[1:] == ["whoami-v2"]:
                    return _json(*self.whoami(request))
                if s[1:] == ["validate-yaml"] and m == "POST":
                    return _json(*self.validate_yaml(request))
                if len(s) >= 4 and s[1] == "models":
                    repo_id, rest = f"{s[2]}/{s[3]}", s[4:]
                    post = m == "POST"
                    if not rest and m == "GET":
                        return _json(*self.model_info(request, repo_id))
                    if rest[:1] == ["revision"] and len(rest) == 2:
                        return _json(*self.model_info(request, repo_id, rest[1]))
                    if rest[:1] == ["preupload"] and post:
                        return _json(*self.preupload(request, repo_id, rest[1]))
                    if rest[:1] == ["commit"] and post:
                        return _json(*self.commit(request, repo_id, rest[1]))
                    if rest[:1] == ["branch"] and post:
                        return _json(*self.create_branch(request, repo_id, rest[1]))
                    if rest[:1] == ["tag"] and post:
                        return _json(*self.create_tag(request, repo_id, rest[1]))
                    if rest == ["refs"]:
                        return _json(*self.refs(request, repo_id))
                    if rest[:1] == ["tree"] and len(rest) in (2, 3):
                        return _json(*self.tree(request, repo_id, rest[1], rest[2] if len(rest) == 3 else ""))
                    if rest[:1] == ["paths-info"] and post:
                        paths = parse_qs(request.body.decode()).get("paths", [])
                        return _json(*self.tree(request, repo_id, rest[1], paths=paths))
            elif len(s) >= 3 and s[1].endswith(".git") and s[2:] == ["info", "lfs", "objects", "batch"]:
                return _json(*self.lfs_batch(request, f"{s[0]}/{s[1][:-4]}"))
            elif len(s) >= 3 and s[1].endswith(".git") and s[2:] == ["info", "lfs", "objects", "verify"]:
                return _json(*self.lfs_verify(request, f"{s[0]}/{s[1][:-4]}"))
            elif len(s) >= 5 and s[2] == "resolve" and m in ("GET", "HEAD"):
                return self.resolve(request, f"{s[0]}/{s[1]}", s[3], "/".join(s[4:]))
            raise HubError(404, f"{m} {request.path} is not served by the local Hub")
        except HubError as error:
            headers = {"X-Error-Message": error.message}
            if error.code:
                headers["X-Error-Code"] = error.code
            if error.commit:
                headers["X-Repo-Commit"] = error.commit
            status, _, body = _json(error.status, {"error": error.message})
            return status, {**headers, "Content-Type": "application/json"}, body


def _json(status: int, payload) -> tuple[int, dict, bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(payload).encode()


@dataclass
class _Request:
    method: str
    path: str
    segments: list[str]
    query: dict[str, str]
    headers: object
    body: bytes
    storage: bool  # to the LFS storage server, not the API


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects; every answer carries its Content-Length

    def log_message(self, format, *args):  # quiet: the hub records requests in `LocalHub.requests`
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                chunk = self.rfile.read(size)
                self.rfile.readline()
                if size == 0:
                    return b"".join(chunks)
                chunks.append(chunk)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _serve(self) -> None:
        hub: LocalHub = self.server.hub
        split = urlsplit(self.path)
        # each segment unquoted on its own: a revision or tree path arrives quoted as one segment ("refs%2Fpr%2F1")
        segments = [unquote(part) for part in split.path.strip("/").split("/")]
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        body = self._body()
        request = _Request(self.command, split.path, segments, query, self.headers, body, self.server.is_storage)
        hub.requests.append((self.command, split.path))
        status, headers, body = hub.route(request)
        if status == 200 and "Range" in self.headers and self.command in ("GET", "HEAD"):
            start = int(self.headers["Range"].removeprefix("bytes=").split("-")[0])
            headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
            status, body = 206, body[start:]
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _serve


@contextmanager
def client_pointed_at(hub: LocalHub, home: Path, monkeypatch):
    """Point huggingface_hub (and transformers over it) at `hub`, online, with `hub.token` stored in `home`.

    The environment is set for subprocesses, which read it at import as a user's process does. In this process
    huggingface_hub read it at its import already (`constants.ENDPOINT`, `HF_HUB_OFFLINE`, the cache and token
    paths): its `constants` module is re-executed under the new environment and restored afterwards; the client
    reads `constants.X` at each call. Two `HfApi` instances made at import keep the endpoint they saw then:
    huggingface_hub's module-level one and transformers' shared one (re-made on first use)."""
    import importlib

    import huggingface_hub.constants as constants
    import transformers.utils.hub as transformers_hub
    from huggingface_hub import hf_api

    home.mkdir(parents=True, exist_ok=True)
    (home / "token").write_text(hub.token)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HF_TOKEN_PATH", "HF_STORED_TOKENS_PATH", "HF_XET_CACHE", "HF_ASSETS_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_MODULES_CACHE", str(home / "modules"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")  # Xet storage is not served: large files go through git-lfs
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    saved = dict(vars(constants))
    importlib.reload(constants)
    try:
        monkeypatch.setattr(hf_api.api, "endpoint", constants.ENDPOINT)
        monkeypatch.setattr(transformers_hub, "_hf_api", None)
        yield hub
    finally:
        vars(constants).update(saved)
