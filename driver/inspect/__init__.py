"""``kubectl patchbay``: read-only views of what the driver published, what
the scheduler allocated and what went wrong, from the API alone (slices,
claims, the Nodes' fabric reports, Events).

:mod:`.inventory` turns recorded API objects (plain dicts) into per-node
facts; :mod:`.nodes`, :mod:`.topology`, :mod:`.claims` and :mod:`.fabric`
are the views with their text renderers, :mod:`.svg` draws the topology,
:mod:`.events` picks the error Events, :mod:`.table` aligns columns;
:mod:`.fetch` reads the API through :mod:`driver.kube.api`, and :mod:`.cli`
is the console script ``kubectl-patchbay``. Rendering never touches the
network, so tests feed recorded objects.
"""
