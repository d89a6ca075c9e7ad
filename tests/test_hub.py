"""The Hub through its real client: `push_to_hub` and `from_pretrained(repo_id, trust_remote_code=True)` run
huggingface_hub's own HTTP code against `helpers_hub.LocalHub` on 127.0.0.1 (repo creation, preupload, git-lfs
upload of the weights, NDJSON commit, a branch and a tag, HEAD/GET resolve), for a model of each family."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import make_tiny_config
from huggingface_hub import HfApi
from huggingface_hub.errors import RevisionNotFoundError
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.usefixtures("single_thread")

CASES = ["zpx", "pct", "versor-hybrid"]

# A user's fresh process: HF_ENDPOINT read from the environment at import, zpx_hf not importable, so only the
# remote code downloaded from the Hub can build the model; one intra-op thread, as the test's process has.
DOWNLOAD = textwrap.dedent(
    """
    import json, sys
    sys.modules["zpx_hf"] = None
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(1)
    results = {}
    for repo_id, revision in json.loads(sys.argv[1]):
        model = AutoModelForCausalLM.from_pretrained(repo_id, revision=revision, trust_remote_code=True).eval()
        with torch.no_grad():
            logits = model(input_ids=torch.load(sys.argv[2])).logits
        results[f"{repo_id}@{revision}"] = {
            "module": type(model).__module__, "state": model.state_dict(), "logits": logits,
        }
    torch.save(results, sys.argv[3])
    """
)


def tiny_model(case, seed):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(make_tiny_config(case)).eval()


def test_push_a_branch_and_a_tag_then_load_remote_code_of_each_revision(local_hub, tmp_path):
    api = HfApi()
    ids = torch.randint(3, 61, (2, 7), generator=torch.Generator().manual_seed(0))
    torch.save(ids, tmp_path / "ids.pt")
    pushed, wanted = {}, []
    for case in CASES:
        repo_id = f"{local_hub.user}/tiny-{case}"
        first, second = tiny_model(case, seed=0), tiny_model(case, seed=1)
        commit = first.push_to_hub(repo_id)  # creates the repo, uploads to main
        api.create_tag(repo_id, tag="v1.0")  # main as it is now
        second.push_to_hub(repo_id, revision="dev")  # a new branch from main, then a commit on it
        assert api.list_repo_refs(repo_id).tags[0].target_commit == commit.oid
        revisions = [("main", first), ("dev", second)]
        if case == "zpx":  # a tag and a commit id resolve alike for every family: once is enough
            revisions += [("v1.0", first), (commit.oid, first)]
            tagged = commit.oid
        for revision, model in revisions:
            pushed[f"{repo_id}@{revision}"] = model
            wanted.append((repo_id, revision))
        # the files on the Hub are those `save_pretrained` writes (remote code included) and the client's README
        first.save_pretrained(tmp_path / case)
        saved = {p.name: p.read_bytes() for p in (tmp_path / case).iterdir()}
        on_hub = local_hub.files(repo_id, "main")
        assert set(on_hub) == {*saved, "README.md", ".gitattributes"}
        assert all(on_hub[name] == data for name, data in saved.items()), case
        assert local_hub.files(repo_id, "dev")["model.safetensors"] != on_hub["model.safetensors"]
    # the weights went through git-lfs (batch API, PUT to the storage host, verify), the rest in the commit
    methods = {(method, path.split("/")[-1] if "lfs" in path else path) for method, path in local_hub.requests}
    assert {("POST", "batch"), ("POST", "verify")} <= methods
    assert sum(method == "PUT" for method, _ in local_hub.requests) == 2 * len(CASES)

    script = tmp_path / "download.py"
    script.write_text(DOWNLOAD)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = [sys.executable, str(script), json.dumps(wanted), str(tmp_path / "ids.pt"), str(tmp_path / "out.pt")]
    done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = torch.load(tmp_path / "out.pt")
    for key, model in pushed.items():
        result = results[key]
        assert result["module"].startswith("transformers_modules."), key  # the Hub's copy of the code ran
        reference = model.state_dict()
        assert set(result["state"]) == set(reference), key
        for name, value in result["state"].items():
            assert torch.equal(value, reference[name]), f"{key}: {name}"
        with torch.no_grad():  # same weights, same code, one thread in both processes: the same bits
            assert torch.equal(result["logits"], model(input_ids=ids).logits), key
    # every file came over HTTP from this server, each revision resolved by it
    resolved = {path.split("/resolve/")[1].split("/")[0] for _, path in local_hub.requests if "/resolve/" in path}
    assert {"main", "dev", "v1.0", tagged} <= resolved


def test_missing_revision_and_missing_token_are_the_hubs_errors(local_hub, tmp_path):
    model = tiny_model("zpx", seed=0)
    repo_id = f"{local_hub.user}/tiny-zpx"
    model.push_to_hub(repo_id)
    with pytest.raises(OSError, match="no-such-branch is not a valid git identifier"):
        AutoModelForCausalLM.from_pretrained(repo_id, revision="no-such-branch", trust_remote_code=True)
    with pytest.raises(RevisionNotFoundError):
        HfApi().model_info(repo_id, revision="no-such-branch")
    (tmp_path / "hf_home" / "token").unlink()  # logged out: the Hub refuses writes
    with pytest.raises(Exception, match="401"):
        model.push_to_hub(repo_id)
