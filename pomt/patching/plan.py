"""How many tokens each block sees under a removal plan; validation of `prune` arguments."""

from __future__ import annotations

from collections.abc import Mapping

from pomt.checks import check_method, check_prune_block
from pomt.errors import PatchError
from pomt.patching.tome import max_merge


def resolve_removal(prune: Mapping[int, int] | int, depth: int) -> dict[int, int]:
    """{block: tokens removed} with zero entries dropped; an int means every block (ToMe style)."""
    if isinstance(prune, bool) or not isinstance(prune, (int, Mapping)):
        raise PatchError(f"prune must be an int or a {{block: remove}} mapping, got {type(prune).__name__}")
    items = {block: prune for block in range(depth)} if isinstance(prune, int) else dict(prune)
    removal: dict[int, int] = {}
    for block, remove in sorted(items.items()):
        check_prune_block(block, depth)
        if isinstance(remove, bool) or not isinstance(remove, int) or remove < 0:
            raise PatchError(f"tokens to remove at block {block} must be an integer >= 0, got {remove!r}")
        if remove:
            removal[block] = remove
    return removal


def removed_at(method: str, patch_tokens: int, remove: int) -> int:
    """Tokens actually removed by one block that sees `patch_tokens` patch tokens.

    ToMe clamps to the published cap, (tokens - protected) // 2 with every prefix token protected,
    i.e. half the patch tokens; every other method raises PatchError when no patch token would be left.
    """
    if method == "tome":
        return min(remove, max_merge(patch_tokens))
    if remove >= patch_tokens:
        raise PatchError(
            f"cannot remove {remove} tokens from {patch_tokens} patch tokens: at least one must stay "
            f"(remove at most {patch_tokens - 1})"
        )
    return remove


def token_counts(
    num_tokens: int, prefix_tokens: int, depth: int, method: str, removal: Mapping[int, int]
) -> list[int]:
    """Tokens entering each block, then the count leaving the last one (depth + 1 values)."""
    check_method(method)
    counts = [num_tokens]
    for block in range(depth):
        tokens = counts[-1]
        remove = removal.get(block, 0)
        counts.append(tokens - removed_at(method, tokens - prefix_tokens, remove) if remove else tokens)
    return counts
