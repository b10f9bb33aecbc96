"""The [storage] section: fsync mode and archiving."""

from __future__ import annotations

import pytest

from amqp_server.config.settings import ConfigError, load_config


def config_from(tmp_path, text: str):
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return load_config(["--config", str(path)], environ={})


def test_storage_defaults_fsync_always_and_no_archive(tmp_path):
    config = config_from(tmp_path, "")
    assert config.storage.fsync == "always"
    assert config.storage.archive is False
    assert config.storage.archive_vhosts == []


def test_storage_section_sets_fsync_and_archive(tmp_path):
    config = config_from(tmp_path, '[storage]\nfsync = "batch-ms:5"\narchive = true\n')
    assert config.storage.fsync == "batch-ms:5"
    assert config.storage.archive is True


def test_vhost_can_be_archived_on_its_own(tmp_path):
    config = config_from(tmp_path, '[[vhosts]]\nname = "/"\n\n[[vhosts]]\nname = "history"\narchive = true\n')
    assert config.storage.archive_vhosts == ["history"]


@pytest.mark.parametrize("mode", ["sometimes", "batch-ms:0", "batch-ms:x"])
def test_unknown_fsync_mode_is_refused_naming_the_key(tmp_path, mode):
    with pytest.raises(ConfigError, match=r"\[storage\] fsync"):
        config_from(tmp_path, f'[storage]\nfsync = "{mode}"\n')
