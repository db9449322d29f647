"""Docker-specific properties of the docker backend, on a real engine and the real image.

The behaviour both backends share (statuses, limits, hostile programs, grading) is the parametrised suite's job;
here: what the container itself guarantees (no network, read-only root, non-root, no capabilities, the locked
socket folder), recycling, recovery from outside damage, clean-up, and the errors when Docker is missing.
"""

import os

import pytest

import sandbox
from sandbox.docker_backend import LABEL

PROBE = """
import os, socket
print(socket.gethostname())
"""


def our_containers(client):
    """Ids of the sandbox containers this test process owns (sparse: no inspect of containers that recycling may
    be removing at that moment)."""
    return {c.id for c in client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL}={os.getpid()}"})}


@pytest.fixture(scope="module")
def client():
    from sandbox.image import connect

    return connect()


@pytest.fixture(scope="module")
def sb():
    with sandbox.open_sandbox(backend="docker", workers=1, timeout_s=5.0, cache=False) as box:
        yield box


@pytest.mark.docker
def test_no_network(sb):
    source = """
import socket
with open('/proc/net/dev') as f:
    interfaces = sorted(line.split(':')[0].strip() for line in f if ':' in line)
assert interfaces == ['lo'], interfaces
for address in [('1.1.1.1', 53), ('172.17.0.1', 2375)]:
    try:
        socket.create_connection(address, timeout=1)
    except OSError:
        pass
    else:
        raise SystemExit('connected to %r' % (address,))
print('isolated')
"""
    r = sb.run(source)
    assert (r.status, r.stdout) == ("ok", "isolated\n"), r.stderr
    assert r.meta["network_isolated"] is True and r.meta["backend"] == "docker"


@pytest.mark.docker
def test_read_only_root_and_writable_work_dir(sb):
    source = """
import errno, os
for path in ['/etc/evil', '/usr/evil', '/evil', '/opt/selfplay/forkserver.py']:
    try:
        open(path, 'w').write('x')
    except OSError as exc:
        assert exc.errno in (errno.EROFS, errno.EACCES), (path, exc)
    else:
        raise SystemExit('wrote ' + path)
open('here.txt', 'w').write('fine')
print(open('here.txt').read())
"""
    r = sb.run(source)
    assert (r.status, r.stdout) == ("ok", "fine\n"), r.stderr


@pytest.mark.docker
def test_non_root_without_capabilities(sb):
    source = """
import os
status = dict(line.split(':', 1) for line in open('/proc/self/status'))
print(os.getuid(), os.geteuid(), int(status['CapEff'], 16), int(status['CapBnd'], 16), status['NoNewPrivs'].strip())
"""
    r = sb.run(source)
    uid, euid, cap_eff, cap_bnd, no_new_privs = r.stdout.split()
    assert r.status == "ok" and int(uid) != 0 and int(euid) != 0
    assert (cap_eff, cap_bnd, no_new_privs) == ("0", "0", "1")


@pytest.mark.docker
def test_program_cannot_touch_socket_folder_or_server(sb):
    source = """
import os
for attempt in [lambda: open('/run/sandbox/evil', 'w'), lambda: os.unlink('/run/sandbox/worker.sock'),
                lambda: open('/proc/1/mem', 'rb').read(1)]:
    try:
        attempt()
    except OSError:
        continue
    raise SystemExit('allowed')
print('denied')
"""
    r = sb.run(source)
    assert (r.status, r.stdout) == ("ok", "denied\n"), r.stderr
    assert r.meta["socket_dir_locked"] is (os.geteuid() == 0)
    assert sb.run("print(1)").stdout == "1\n"


@pytest.mark.docker
def test_recycled_after_max_programs():
    with sandbox.open_sandbox(backend="docker", workers=1, cache=False, max_programs=3) as box:
        results = [box.run(PROBE) for _ in range(7)]
        assert all(r.status == "ok" for r in results)
        hosts = [r.stdout for r in results]
        # programs 1-3 in the first container, 4-6 in the second, 7 in the third
        assert hosts[0] == hosts[1] == hosts[2] != hosts[3] == hosts[4] == hosts[5] != hosts[6]
        assert box._pool.recycled["max_programs"] == 2


@pytest.mark.docker
def test_recovers_after_container_killed_from_outside(client):
    before = our_containers(client)  # the module's shared sandbox
    with sandbox.open_sandbox(backend="docker", workers=2, cache=False) as box:
        first = box.run_many([PROBE] * 4)
        names = {r.meta["container"] for r in first}
        for name in names:
            container = client.containers.get(name)
            container.kill()
            container.wait(timeout=30)  # dead before the next call, so no program is running when it dies
        after = box.run_many([PROBE] * 4)
        assert [r.status for r in after] == ["ok"] * 4
        assert not names & {r.meta["container"] for r in after}
        assert box._pool.recycled["dead_idle"] == len(names)
    assert our_containers(client) == before


@pytest.mark.docker
def test_container_killed_during_a_program_gives_killed_and_a_new_container(client):
    import threading

    with sandbox.open_sandbox(backend="docker", workers=1, cache=False) as box:
        victim = box.run(PROBE).meta["container"]
        threading.Timer(0.5, client.containers.get(victim).kill).start()
        r = box.run("import time\ntime.sleep(5)")
        assert r.status == "killed" and r.meta["network_isolated"] is True and r.meta["container"] != victim
        assert box._pool.recycled["broken"] == 1
        assert box.run("print(3)").stdout == "3\n"


@pytest.mark.docker
def test_replacement_impossible_is_an_error_then_the_pool_recovers(client):
    """The image vanishes and the container dies: a one-line SandboxUnavailable, no hang; image back, runs again."""
    from sandbox.image import DEFAULT_IMAGE

    tag = "selfplay-sandbox-test:vanishing"
    client.images.get(DEFAULT_IMAGE).tag(tag)
    try:
        with sandbox.open_sandbox(backend="docker", image=tag, workers=1, cache=False) as box:
            victim = box.run(PROBE).meta["container"]
            client.images.remove(tag)  # untags only: the image stays for DEFAULT_IMAGE
            client.containers.get(victim).kill()
            client.containers.get(victim).wait(timeout=30)
            with pytest.raises(sandbox.SandboxUnavailable) as info:
                box.run(PROBE)
            assert "\n" not in str(info.value) and "selfplay sandbox build-image" in str(info.value)
            client.images.get(DEFAULT_IMAGE).tag(tag)
            assert box.run("print(4)").stdout == "4\n"
    finally:
        if tag in {t for image in client.images.list() for t in image.tags}:
            client.images.remove(tag)


@pytest.mark.docker
def test_program_killing_its_server_gets_status_and_pool_recovers():
    with sandbox.open_sandbox(backend="docker", workers=1, cache=False) as box:
        r = box.run(
            "import os, signal\nos.kill(1, signal.SIGKILL)\nos.kill(os.getppid(), signal.SIGKILL)\n"
            "import ctypes\nctypes.string_at(0)"
        )
        assert r.status in ("killed", "error")
        assert box.run("print(2)").stdout == "2\n"


@pytest.mark.docker
def test_no_container_left_after_close(client):
    before = our_containers(client)
    with sandbox.open_sandbox(backend="docker", workers=2, cache=False, max_programs=2) as box:
        box.run_many([PROBE] * 6)
        box.run("import time\nwhile True: time.sleep(1)", timeout_s=0.5)
        # two serving, plus replacements warming up and recycled ones still being removed
        assert len(our_containers(client) - before) >= 2
    assert our_containers(client) == before


@pytest.mark.docker
def test_containers_of_a_crashed_process_are_removed_by_the_next_pool(client):
    import subprocess
    import sys

    crash = "import os, sandbox\nsb = sandbox.open_sandbox(backend='docker', workers=1)\nsb.run('pass')\nos._exit(0)"
    subprocess.run([sys.executable, "-c", crash], check=True, timeout=120)
    orphans = client.containers.list(all=True, sparse=True, filters={"label": LABEL})
    orphans = [c for c in orphans if c.attrs["Labels"][LABEL] != str(os.getpid())]
    assert orphans  # os._exit skipped every clean-up
    folders = [m["Source"] for c in orphans for m in c.attrs["Mounts"] if m["Destination"] == "/run/sandbox"]
    assert folders and all(os.path.isdir(f) for f in folders)
    with sandbox.open_sandbox(backend="docker", workers=1, cache=False):
        left = {c.id for c in client.containers.list(all=True, sparse=True, filters={"label": LABEL})}
        assert not left & {c.id for c in orphans}
        assert not any(os.path.exists(f) for f in folders)


@pytest.mark.docker
def test_missing_image_is_a_one_line_error():
    with pytest.raises(sandbox.SandboxUnavailable) as info:
        sandbox.open_sandbox(backend="docker", image="selfplay-no-such-image:none")
    message = str(info.value)
    assert "\n" not in message and "selfplay sandbox build-image --name selfplay-no-such-image:none" in message


def test_engine_not_running_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-dockerd.sock")
    with pytest.raises(sandbox.SandboxUnavailable) as info:
        sandbox.open_sandbox(backend="docker")
    message = str(info.value)
    assert "\n" not in message and "dockerd" in message and "docker info" in message


@pytest.mark.parametrize(
    "options, word",
    [
        ({"max_programs": -1}, "max_programs"),
        ({"cpus": 0}, "cpus"),
        ({"pids_limit": 2}, "pids_limit"),
        ({"netwrk": "host"}, "netwrk"),
    ],
)
def test_bad_options_are_config_errors(options, word):
    with pytest.raises(sandbox.SandboxConfigError, match=word):
        sandbox.open_sandbox(backend="docker", **options)
