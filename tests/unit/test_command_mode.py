"""The seed's three example scripts (examples/seed/) are the Lightning guide's code, unchanged. (Running them and any
other command through mmt: tests/e2e/test_command_mode.py.)"""

import hashlib

from helpers.paths import REPO

SEED = REPO / "examples" / "seed"
SEED_DOC = REPO.parent / "shared" / "seed" / "multi-node-training.md"


# SHA-256 of the guide's three code blocks, as copied into examples/seed/ (checked against the guide itself
# wherever ../shared/seed is present; the digests keep the check alive in a clone without it, such as CI's)
SEED_DIGESTS = {
    "trainer.py": "5e59f6e3c3e288719566fded99fc6d78e6a00e354f885826c4fa8a2252da6cb8",
    "fabric.py": "147223ef673319fec7aea204779c04a2a1c97f493d598db286fb66ac722c4c77",
    "pytorch_ddp.py": "75ff7879de876858b62395cd722553fbce19684d2b40ba08467cc13181c6c7e2",
}


def test_seed_scripts_are_the_guides_code_unchanged():
    for name, digest in SEED_DIGESTS.items():
        assert hashlib.sha256((SEED / name).read_bytes()).hexdigest() == digest, f"examples/seed/{name} was edited"
    if SEED_DOC.exists():
        guide = SEED_DOC.read_text()
        for name in SEED_DIGESTS:
            assert (SEED / name).read_text() in guide, name
