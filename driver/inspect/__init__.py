"""``kubectl patchbay``: read-only views of what the driver published and
what the scheduler allocated, from the API alone (slices and claims).

:mod:`.inventory` turns recorded API objects (plain dicts) into per-node
facts, :mod:`.nodes` and :mod:`.topology` render them, :mod:`.fetch` reads
the API through :mod:`driver.kube.api`, and :mod:`.cli` is the console
script ``kubectl-patchbay``. Rendering never touches the network, so tests
feed recorded objects.
"""
