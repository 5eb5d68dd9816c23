"""Container images of the project, built from its own Dockerfile without Docker.

Dev tooling (never imported by what runs in a cluster): ``lorapool image build`` and the
images tests. The Dockerfile stays the one recipe; this package only feeds it a local base
image and a wheelhouse, runs buildah and checks the results in containerd.

    recipe.py      pure: build context, content keys, buildah argv
    build.py       the shell: Debian tools, base rootfs, wheelhouse, buildah, OCI archives
    containerd.py  a private containerd to import and run the archives, as a node would
    cli.py         ``lorapool image build [--out DIR]``
"""
