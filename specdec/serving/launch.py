"""The launcher's earlier command, `python -m specdec.serving.launch`, kept for deployments
that name it; the launcher is specdec/launcher/launch.py."""
from specdec.launcher.launch import main

if __name__ == "__main__":
    main()
