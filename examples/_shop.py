"""Pretend services for the demo workflows: a payment gateway that sometimes says no, a
warehouse that takes its time. Helper module (leading underscore): not a workflow file."""

from __future__ import annotations

import anyio


class GatewayDeclined(RuntimeError):
    """The payment gateway refused the charge; a retry may go through."""


async def call_gateway(order_id: str, amount: int, attempt: int, flaky_attempts: int) -> dict:
    await anyio.sleep(0.15)
    if attempt <= flaky_attempts:
        raise GatewayDeclined(f"gateway 503 for order {order_id} (attempt {attempt})")
    return {"charged": amount, "reference": f"ch_{order_id.lower()}"}


async def pack(items: int) -> dict:
    # Packing time grows with the number of items: a few seconds per order.
    await anyio.sleep(0.4 + 0.3 * items)
    return {"parcels": max(1, items // 3)}
