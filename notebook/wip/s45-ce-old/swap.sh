# On the device: the session-start cross-entropy range template and spec in place of the
# working tree's, for one timing beside the new ones in the same call.
cp notebook/wip/s45-ce-old/cross_entropy_rt.cu.j2 kernel_templates/
cp notebook/wip/s45-ce-old/cross-entropy-range-h200.yaml pipelines/
