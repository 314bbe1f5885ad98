"""``plancache explain``: why a node's factors found no plan, named by the factors that differ.

Given a node's factors (a JSON file: ``read_factors``), it reads every plan of the store
and lists those nearest to them (fewest factors that differ; of the node's model where the
file names one and the store holds plans of it), each with the factors that differ, the
stored value and the node's. A plan stored under the node's own key is a hit, said first.
Nothing is changed.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from plancache._command.display import echo, print_json
from plancache._command.fingerprint import read_factors
from plancache._command.stores import open_named
from plancache._inventory import plans as inventory
from plancache._keys import ABSENT, Difference, Scalar, differences, fingerprint
from plancache._plan import MODEL_LABEL, Plan
from plancache._redaction import printable

NEAREST = 5
"""Plans listed by default."""


def nearest(
    plans: list[Plan], given: Mapping[str, Scalar], model: object, limit: int
) -> list[tuple[Plan, list[Difference]]]:
    """The ``limit`` plans nearest to ``given`` (fewest differences, then newest), of
    ``model`` only where some plan is labelled with it."""
    same = [p for p in plans if model is not None and p.labels.get(MODEL_LABEL) == model]
    ranked = [(p, differences(p.factors, given)) for p in (same or plans)]
    ranked.sort(key=lambda pd: (len(pd[1]), -(pd[0].newest.created_at if pd[0].newest else 0)))
    return ranked[:limit]


def _text(value: object) -> str:
    return "(absent)" if value is ABSENT else printable(repr(value))[:120]


def cmd_explain(args: argparse.Namespace) -> int:
    """Print the plans nearest to the node's factors and what differs (``--json``: as an
    object); 0 whether or not a plan is stored under the node's key."""
    given, labels = read_factors(args.factors)
    key = fingerprint(given)
    store = open_named(args, args.url)
    plans = [e.plan for e in inventory.scan(store) if e.plan is not None]
    model = labels.get(MODEL_LABEL)
    found = nearest(plans, given, model, args.limit)
    hit = any(p.fingerprint == key for p in plans)
    if args.json:
        print_json(
            {
                "fingerprint": key,
                "stored": hit,
                "plans": len(plans),
                "nearest": [
                    {
                        "fingerprint": p.fingerprint,
                        "model": p.labels.get(MODEL_LABEL),
                        "differs": [d.to_dict() for d in diffs],
                    }
                    for p, diffs in found
                ],
            }
        )
        return 0
    echo(
        f"factors {key[:12]}: "
        + (
            "a plan is stored under this key (a hit)"
            if hit
            else "no plan is stored under this key (a miss)"
        )
    )
    if not found:
        echo(f"{store.url} holds no plan to compare with")
    for p, diffs in found:
        name = p.labels.get(MODEL_LABEL, "-")
        echo(f"{p.fingerprint[:12]}  model {printable(str(name))}: {len(diffs)} factors differ")
        for d in diffs:
            echo(f"  {printable(d.factor)}: stored {_text(d.stored)}, this node {_text(d.given)}")
    return 0
