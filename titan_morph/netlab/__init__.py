"""netlab: a real small cluster on one machine, to train across slow, congested or broken links.

Nodes are network namespaces joined by veth pairs on two bridges, one per NIC kind (``data`` for
the pipeline's default path, ``host`` for delegates and the control plane); ``tc`` shapes any
node-to-node path live and blackhole routes break one. ``python -m titan_morph.netlab`` is the
command line (:mod:`.lab` makes the nodes, :mod:`.shape` limits and breaks paths,
:mod:`.schedule` changes them over time, :mod:`.run` trains across the nodes, :mod:`.transfer`
times a payload). A top-level tool: no library layer imports it.
"""
