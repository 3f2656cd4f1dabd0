"""Search: the space, the strategies (agents) that propose points of it, and the
search core the loop and the replay bench both run (stop rules, patience, the
proposal filter, what to build ahead); replay datasets and the bench."""
