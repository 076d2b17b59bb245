"""``durably ui``: a local dashboard of a store's runs (Starlette, served by uvicorn).

It reads the store through :mod:`durably.store`'s protocol and the public run API, and never
imports or runs the user's code: answering an interrupt journals the answer as ``resume``
would, and the run continues when it is next resumed. Needs ``pip install 'durably[ui]'``.
"""

from __future__ import annotations

from durably._ui.app import create_app, new_token

__all__ = ["create_app", "new_token"]
