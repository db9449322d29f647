"""`selfplay sandbox build-image` and `sandbox.image`: idempotent, offline-capable builds, one-line errors."""

import pytest

from sandbox.image import DEFAULT_IMAGE, RECIPE_LABEL, ImageBuildError, build_image, connect, image_recipe, recipe_hash
from selfplay.cli import main


def test_recipe_hash_names_the_method_and_is_stable():
    assert recipe_hash("debootstrap") == recipe_hash("debootstrap")
    assert recipe_hash("debootstrap").startswith("debootstrap-") and recipe_hash("dockerfile").startswith("dockerfile-")
    assert recipe_hash("debootstrap", "bookworm") != recipe_hash("debootstrap", "trixie")


def test_unknown_method_is_a_one_line_error():
    with pytest.raises(ImageBuildError, match="unknown image build method 'podman'") as info:
        build_image(method="podman")
    assert "\n" not in str(info.value)


def test_cli_needs_an_action(capsys):
    assert main(["sandbox"]) == 2
    err = capsys.readouterr().err
    assert "build-image" in err and err.count("\n") == 1


@pytest.mark.docker
def test_second_build_is_a_no_op(capsys):
    assert main(["sandbox", "build-image"]) == 0  # CI built it already; here it is up to date, or built now
    capsys.readouterr()
    assert main(["sandbox", "build-image"]) == 0
    assert "up to date" in capsys.readouterr().out


@pytest.mark.docker
def test_offline_build_from_cached_rootfs_gives_a_working_image(tmp_path):
    """debootstrap + docker import under another name (reusing the cached root filesystem), then run it."""
    import sandbox

    name = "selfplay-sandbox-test:import"
    client = connect()
    lines = []
    try:
        summary = build_image(name, "debootstrap", force=True, log=lines.append)
        assert summary["built"] and summary["python"].startswith("3.11")
        assert image_recipe(client, name) == recipe_hash("debootstrap") == client.images.get(name).labels[RECIPE_LABEL]
        assert any("docker import" in line for line in lines)
        with sandbox.open_sandbox(backend="docker", image=name, workers=1, cache=False) as box:
            r = box.run("import resource, sqlite3, json; print(resource.getrlimit(resource.RLIMIT_AS)[0] > 0)")
            assert (r.status, r.stdout) == ("ok", "True\n"), r.stderr
    finally:
        if name != DEFAULT_IMAGE:
            client.images.remove(name, force=True)


@pytest.mark.docker
def test_dockerfile_build_works_or_says_to_use_debootstrap():
    """Where a registry answers the Dockerfile builds a working image; offline the error names the way out."""
    name = "selfplay-sandbox-test:dockerfile"
    client = connect()
    try:
        summary = build_image(name, "dockerfile", force=True, log=lambda line: None)
    except ImageBuildError as exc:
        assert "\n" not in str(exc) and "--method debootstrap" in str(exc)
    else:
        assert summary["python"].startswith("3.11") and image_recipe(client, name) == recipe_hash("dockerfile")
    finally:
        if image_recipe(client, name) is not None:
            client.images.remove(name, force=True)
